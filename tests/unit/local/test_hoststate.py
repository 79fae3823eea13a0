"""hoststate's waits: a killed process counts as gone once it has exited, even before it is reaped."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

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
