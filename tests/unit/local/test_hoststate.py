"""hoststate's waits: a killed process counts as gone once it has exited, even before it is reaped."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from sandfleet.local import hoststate


async def test_until_exited_returns_once_a_killed_process_is_a_zombie() -> None:
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")
    try:
        assert await hoststate.until_exited([child.pid], timeout_s=0.2) == [child.pid]  # still running
        os.kill(child.pid, signal.SIGKILL)
        # Whether or not it is reaped yet (a zombie has left its cgroups), a teardown may go on.
        assert await hoststate.until_exited([child.pid], timeout_s=10) == []
    finally:
        if child.returncode is None:
            child.kill()
        await child.wait()
    assert await hoststate.until_exited([child.pid], timeout_s=1) == []  # reaped: no such process


async def test_cgroups_of_no_container_are_settled_at_once() -> None:
    assert await hoststate.remove_cgroups_settled("sf-no-such-instance-", timeout_s=5) == 0


async def test_busy_cgroups_are_removed_again_until_they_go_or_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A directory with a file in it cannot be removed, as a cgroup with a process in it cannot.
    parent = tmp_path / "cpu" / hoststate.CGROUP_PARENT
    busy, idle = parent / "sf-a-busy", parent / "sf-a-idle"
    for cgroup in (busy, idle):
        cgroup.mkdir(parents=True)
    (busy / "process").touch()
    monkeypatch.setattr(hoststate, "CGROUP_ROOT", tmp_path)

    started = time.monotonic()
    assert await hoststate.remove_cgroups_settled("sf-a-", timeout_s=0.25) == 1  # the busy one stays
    assert 0.25 <= time.monotonic() - started < 0.25 + 0.2
    assert [c.name for c in parent.iterdir()] == ["sf-a-busy"]

    async def leave() -> None:
        await asyncio.sleep(0.15)
        (busy / "process").unlink()

    leaving = asyncio.create_task(leave())
    started = time.monotonic()
    assert await hoststate.remove_cgroups_settled("sf-a-", timeout_s=5) == 1  # once its process has left
    assert time.monotonic() - started < 1.0
    assert list(parent.iterdir()) == []
    await leaving
