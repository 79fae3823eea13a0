"""Root's file routes under real gVisor: a command that keeps swapping a directory of the working
area for a link to a root-only place never gets the agent (root in the sandbox) to write there."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.e2e.local.conftest import sh

pytestmark = pytest.mark.gvisor

# /logs is root's: the sandbox user cannot write into it, the agent could if it followed the link.
SWAPPER = (
    "cd /workspace && cat > /tmp/swap.py <<'EOF'\n"
    "import os\n"
    "os.mkdir('real'); os.symlink('/logs', 'link')\n"
    "while True:\n"
    "    os.rename('real', 'd'); os.rename('d', 'real')\n"
    "    os.rename('link', 'd'); os.rename('d', 'link')\n"
    "EOF\n"
    "( setsid python3 /tmp/swap.py > /dev/null 2>&1 & )"
)


async def test_a_directory_swapped_for_a_link_mid_request_is_never_written_through(
    agent: httpx.AsyncClient,
) -> None:
    assert (await sh(agent, SWAPPER))["exit_code"] == 0
    statuses: dict[int, int] = {}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        put = await agent.put("/v1/files", params={"path": "d/planted"}, content=b"x")
        statuses[put.status_code] = statuses.get(put.status_code, 0) + 1
        assert put.status_code < 500, put.text
        await asyncio.sleep(0)
    await sh(agent, "pkill -u 1000 -f 'python3 /tmp/[s]wap.py'")
    outside = await sh(agent, "ls -la /logs; ls /logs/planted")
    assert "planted" not in str(outside["stdout"]), (statuses, outside)
