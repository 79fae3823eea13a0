"""Golden snapshots: a set-up sandbox is checkpointed once and new sandboxes are restored from it."""

from __future__ import annotations

import asyncio
import shutil

import httpx
import pytest

from sandfleet.local.errors import LocalRuntimeError
from sandfleet.local.runtime import LocalRuntime
from tests.e2e.local.conftest import host_debris, sh

pytestmark = pytest.mark.gvisor


async def test_restored_sandboxes_start_from_the_identical_set_up_state(runtime: LocalRuntime) -> None:
    golden = await runtime.create()
    async with httpx.AsyncClient(
        base_url=golden.url, headers=golden.headers, timeout=30, trust_env=False
    ) as agent:
        await sh(agent, "echo set-up > /workspace/state")
        job = (await agent.post("/v1/jobs", json={"argv": ["sleep", "1000"]})).json()
    snapshot = await runtime.snapshot(golden)
    await runtime.drain()
    assert golden.id not in runtime.sandboxes

    first, second = await runtime.restore(snapshot), await runtime.restore(snapshot)
    assert len({golden.address, first.address, second.address}) == 3
    assert "runsc_restore_s" in first.timings
    for restored in (first, second):
        async with httpx.AsyncClient(
            base_url=restored.url, headers=restored.headers, timeout=30, trust_env=False
        ) as agent:
            assert (await agent.get("/v1/ready")).status_code == 200
            assert (await sh(agent, "cat /workspace/state"))["stdout"] == "set-up\n"
            # The agent's memory came back too: the golden sandbox's background job still runs.
            status = (await agent.get(f"/v1/jobs/{job['job_id']}")).json()
            assert status["state"] == "running"
            await sh(agent, f"echo {restored.id} > /workspace/mine")
    async with httpx.AsyncClient(
        base_url=second.url, headers=second.headers, timeout=30, trust_env=False
    ) as agent:
        assert (await sh(agent, "cat /workspace/mine"))["stdout"] == f"{second.id}\n"

    for restored in (first, second):
        runtime.release(restored)
    await runtime.drain()
    assert host_debris(runtime, [golden, first, second]) == {}


async def test_restore_from_a_missing_snapshot_is_a_clear_error(runtime: LocalRuntime) -> None:
    golden = await runtime.create()
    snapshot = await runtime.snapshot(golden, keep_running=True)
    assert golden.id in runtime.sandboxes
    async with httpx.AsyncClient(
        base_url=golden.url, headers=golden.headers, timeout=30, trust_env=False
    ) as agent:
        assert (await agent.get("/v1/ready")).status_code == 200
    await asyncio.to_thread(shutil.rmtree, snapshot.path)
    with pytest.raises(LocalRuntimeError, match="does not exist"):
        await runtime.restore(snapshot)
