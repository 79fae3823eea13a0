"""Nothing leaks: destroyed sandboxes, closed runtimes and crashed runtimes leave no debris on the host."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandfleet.local import hoststate, network
from sandfleet.local.artifacts import ImageRef
from sandfleet.local.errors import LocalRuntimeError
from sandfleet.local.runtime import LocalRuntime, RunscSandbox
from tests.e2e.local.conftest import host_debris

pytestmark = pytest.mark.gvisor

REPO = Path(__file__).resolve().parents[3]


async def test_destroy_removes_processes_network_and_cgroups(runtime: LocalRuntime) -> None:
    sandboxes = [await runtime.create() for _ in range(3)]
    before = host_debris(runtime, sandboxes)
    assert before["processes"], "each running sandbox has runsc processes"
    assert len(before["netns"]) == 3
    assert len(before["veths"]) == 3
    for sandbox in sandboxes:
        runtime.release(sandbox)
    await runtime.drain()
    assert host_debris(runtime, sandboxes) == {}


async def test_closing_the_runtime_removes_its_state_and_mounts(runsc: Path, base_image: ImageRef) -> None:
    runtime = LocalRuntime(base_image, runsc)
    await runtime.start()
    sandboxes = [await runtime.create(), await runtime.create()]
    assert hoststate.mounts_under(runtime.instance_dir)
    await runtime.close()
    assert host_debris(runtime, sandboxes) == {}
    assert hoststate.runsc_processes(runtime.runsc_root) == []
    assert hoststate.mounts_under(runtime.instance_dir) == []
    assert not runtime.instance_dir.exists()


def crash_a_runtime(runsc: Path, image: ImageRef) -> dict[str, Any]:
    """Start a runtime with two sandboxes in a child process, then SIGKILL it; return what it owned."""
    image_json = json.dumps({"layout": str(image.layout), "tag": image.tag, "digest": image.digest})
    crashed = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("crash_helper.py")), str(runsc), image_json],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'operator'}:{REPO}"},
    )
    try:
        assert crashed.stdout is not None
        owned: dict[str, Any] = json.loads(crashed.stdout.readline())
    finally:
        crashed.send_signal(signal.SIGKILL)
        crashed.wait()
    return owned


def leftovers(owned: dict[str, Any]) -> dict[str, object]:
    """What of a runtime's belongings is still on the host."""
    instance_dir = Path(owned["instance_dir"])
    slots = [entry["slot"] for entry in owned["sandboxes"]]
    found: dict[str, object] = {
        "processes": hoststate.runsc_processes(Path(owned["runsc_root"])),
        "mounts": hoststate.mounts_under(instance_dir),
        "instance_dir": instance_dir.exists(),
        "netns": [slot for slot in slots if Path(network.netns_path(slot)).exists()],
        "cgroups": list(
            Path("/sys/fs/cgroup").glob(
                f"*/{hoststate.CGROUP_PARENT}/{hoststate.container_prefix(owned['instance_id'])}*"
            )
        ),
    }
    return {kind: value for kind, value in found.items() if value}


async def test_a_crashed_runtime_is_cleaned_up_by_the_next_one(runsc: Path, base_image: ImageRef) -> None:
    owned = await asyncio.to_thread(crash_a_runtime, runsc, base_image)
    # The crash really left debris: sandbox processes, namespaces and mounts outlive their owner.
    debris = leftovers(owned)
    assert {"processes", "mounts", "instance_dir", "netns"} <= set(debris)

    async with LocalRuntime(base_image, runsc) as successor:
        report = successor.cleanup_report
        assert report is not None
        assert owned["instance_id"] in report.instances
        assert report.containers == 2
        assert leftovers(owned) == {}
        # And the successor works normally afterwards.
        sandbox: RunscSandbox = await successor.create()
        async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
            assert (await client.get(f"{sandbox.url}/v1/ready")).status_code == 200


async def test_a_runtime_that_fails_to_start_leaves_nothing(runsc: Path, tmp_path: Path) -> None:
    broken = LocalRuntime(ImageRef(layout=tmp_path, tag="missing", digest="sha256:00"), runsc)
    with pytest.raises(LocalRuntimeError, match="cannot read the config"):
        await broken.start()
    assert not await asyncio.to_thread(broken.instance_dir.exists)
    assert hoststate.mounts_under(broken.instance_dir) == []
