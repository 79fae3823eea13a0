"""The in-process warm pool over real sandboxes, as the local backend drives it: take, refill, clean close."""

from __future__ import annotations

import httpx
import pytest

from sandfleet.local.pool import WarmPool
from sandfleet.local.runtime import LocalRuntime, RunscSandbox
from tests.e2e.local.conftest import host_debris

pytestmark = pytest.mark.gvisor


async def test_taken_sandboxes_answer_and_the_pool_refills_behind_them(runtime: LocalRuntime) -> None:
    announced: list[RunscSandbox] = []
    pool = WarmPool(runtime, size=2, on_ready=announced.append)
    pool.start()
    await pool.wait_full(timeout_s=60)
    assert pool.ready_count == 2

    # The local backend takes the ready sandbox it chose; a taken one is no longer the pool's.
    taken = list(announced[:2])
    assert all(pool.take(sandbox) for sandbox in taken)
    assert not pool.take(taken[0])
    async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
        for sandbox in taken:
            response = await client.post(
                f"{sandbox.url}/v1/exec", json={"argv": ["true"]}, headers=sandbox.headers
            )
            assert response.json()["exit_code"] == 0
    for sandbox in taken:
        runtime.release(sandbox)  # released sandboxes are destroyed, never reused
    await pool.wait_full(timeout_s=60)
    assert pool.ready_count == 2
    assert len(announced) >= 4

    pool.resize(1)
    await runtime.drain()
    assert pool.ready_count == 1
    await pool.close()
    await runtime.drain()
    assert host_debris(runtime, taken) == {}
    assert runtime.sandboxes == {}
