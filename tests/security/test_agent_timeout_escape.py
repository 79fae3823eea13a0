"""Timeout escape under real gVisor: a timed-out, abandoned or killed command ends every process it
started, including a double-forked `setsid` grandchild whose parent exited (reparented away from
the command's group and session), and a fork loop."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.e2e.local.conftest import sh

pytestmark = pytest.mark.gvisor

# The grandchild leaves the group and session, and its parent exits before it: only a subreaper
# (or a cgroup) still knows it came from this command. It records its pid, then sleeps.
ESCAPE = (
    "( setsid sh -c 'echo $$ > {marker}; exec sleep 600' & ) ; "
    "while [ ! -s {marker} ]; do sleep 0.01; done; sleep 600"
)
FORK_LOOP = (
    "( setsid sh -c 'echo $$ > {marker}; while :; do ( sleep 600 & ) ; sleep 0.01; done' & ) ; "
    "while [ ! -s {marker} ]; do sleep 0.01; done; sleep 600"
)


async def _alive(agent: httpx.AsyncClient, marker: str) -> list[str]:
    """The escapee's pid if it still runs, and every sleep 600 of the sandbox user that does."""
    probe = await sh(
        agent, f"pid=$(cat {marker}); kill -0 $pid 2>/dev/null && echo $pid; pgrep -x -f 'sleep 600'"
    )
    return str(probe["stdout"]).split()


async def _marker_written(agent: httpx.AsyncClient, marker: str) -> None:
    deadline = time.monotonic() + 10
    probe = await sh(agent, f"cat {marker} 2>/dev/null")
    while probe["stdout"] == "" and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        probe = await sh(agent, f"cat {marker} 2>/dev/null")


async def _until_gone(agent: httpx.AsyncClient, marker: str, within_s: float = 5.0) -> list[str]:
    deadline = time.monotonic() + within_s
    while True:
        alive = await _alive(agent, marker)
        if not alive or time.monotonic() > deadline:
            return alive
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("script", [ESCAPE, FORK_LOOP], ids=["double-fork-setsid", "fork-loop"])
async def test_a_timed_out_exec_ends_a_double_forked_setsid_grandchild(
    agent: httpx.AsyncClient, script: str
) -> None:
    marker = "/tmp/escapee"
    # Seconds for the escapee to get away inside gVisor before the timeout fires (it then only sleeps).
    result = await sh(agent, script.format(marker=marker), timeout_s=10)
    assert result["timed_out"] is True
    assert str((await sh(agent, f"cat {marker}"))["stdout"]).strip(), "the escapee never started"
    assert await _until_gone(agent, marker, within_s=30) == []


async def test_an_abandoned_stream_ends_a_double_forked_setsid_grandchild(agent: httpx.AsyncClient) -> None:
    marker = "/tmp/escapee-stream"
    async with agent.stream(
        "POST", "/v1/exec/stream", json={"shell": ESCAPE.format(marker=marker)}
    ) as stream:
        async for line in stream.aiter_lines():
            if '"start"' in line:
                break
        await _marker_written(agent, marker)
    # The client hung up: the agent notices within a poll and ends everything the command started.
    assert await _until_gone(agent, marker) == []


async def test_a_killed_job_ends_a_double_forked_setsid_grandchild(agent: httpx.AsyncClient) -> None:
    marker = "/tmp/escapee-job"
    job = (await agent.post("/v1/jobs", json={"shell": ESCAPE.format(marker=marker)})).json()
    await _marker_written(agent, marker)
    killed = (await agent.post(f"/v1/jobs/{job['job_id']}/kill")).json()
    assert killed["state"] == "killed"
    assert await _until_gone(agent, marker) == []


async def test_a_command_that_finishes_may_still_leave_a_server_running(agent: httpx.AsyncClient) -> None:
    started = await sh(agent, "nohup sleep 600 > /dev/null 2>&1 & echo $!")
    assert started["exit_code"] == 0
    pid = str(started["stdout"]).strip()
    assert str((await sh(agent, f"kill -0 {pid} && echo alive"))["stdout"]).strip() == "alive"
