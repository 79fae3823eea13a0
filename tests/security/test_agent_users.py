"""The uid split under real gVisor: the agent is root in the sandbox, every command it runs is the
unprivileged sandbox user, which can read neither the agent's token nor its stdio, and owns what
the agent writes for it."""

from __future__ import annotations

import io
import json
import tarfile

import httpx
import pytest

from sandfleet.local.runtime import RunscSandbox
from tests.e2e.local.conftest import sh

pytestmark = pytest.mark.gvisor

IDENTITY = (
    'id -u; id -g; id -G; echo "$HOME"; grep -E "^(Uid|Gid):" /proc/self/status | tr -s "\\t" " "; '
    'grep -E "^Cap(Inh|Prm|Eff|Bnd|Amb):" /proc/self/status'
)
# Real, effective, saved and file-system ids all 1000: no way back to root.
SANDBOX_USER = ["1000", "1000", "/home/sandbox", "Uid: 1000 1000 1000 1000", "Gid: 1000 1000 1000 1000"]
# The one supplementary group is the command's marker: a gid no file or group entry names.
MARKER_BASE = 0x4000_0000
NO_CAPS = "0000000000000000"


def _identity(stdout: str) -> tuple[list[str], dict[str, str]]:
    lines = stdout.split("\n")
    caps = dict(line.split(":\t") for line in lines[6:] if line)
    groups = lines[2].split()
    assert len(groups) == 2, groups
    assert groups[0] == "1000"
    assert int(groups[1]) >= MARKER_BASE
    return [line.strip() for index, line in enumerate(lines[:6]) if index != 2], caps


async def test_exec_stream_and_jobs_run_as_the_sandbox_user_without_groups_or_capabilities(
    agent: httpx.AsyncClient,
) -> None:
    health = (await agent.get("/v1/health")).json()
    assert set(health) == {"status", "version"}, "health is unauthenticated: it must not describe the sandbox"
    outputs = [str((await sh(agent, IDENTITY))["stdout"])]
    async with agent.stream("POST", "/v1/exec/stream", json={"shell": IDENTITY}) as stream:
        events = [json.loads(line) async for line in stream.aiter_lines() if line]
    outputs.append("".join(str(event["data"]) for event in events if event["event"] == "stdout"))
    job = (await agent.post("/v1/jobs", json={"shell": IDENTITY})).json()
    await agent.get(f"/v1/jobs/{job['job_id']}/wait", params={"timeout_s": 30})
    output = (await agent.get(f"/v1/jobs/{job['job_id']}/output")).json()
    outputs.append(str(output["data"]))
    markers = {stdout.split("\n")[2] for stdout in outputs}
    assert len(markers) == 3, "every command has a marker of its own"
    for stdout in outputs:
        ids, caps = _identity(stdout)
        assert ids == SANDBOX_USER
        for name in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
            assert caps[name] == NO_CAPS, f"{name} {caps[name]}"
    drop = await sh(agent, "setpriv --clear-groups true; setpriv --groups=1000 true")
    assert str(drop["stderr"]).count("Operation not permitted") == 2, "the marker cannot be dropped"
    pid1 = await sh(agent, "grep -E '^(Uid|Gid):' /proc/1/status")
    assert str(pid1["stdout"]).split()[1] == "0", "the agent itself is root inside gVisor"


async def test_the_agents_token_and_stdio_are_out_of_the_sandbox_users_reach(
    agent: httpx.AsyncClient, sandbox: RunscSandbox
) -> None:
    assert sandbox.token, "the local runtime gives every agent a token"
    probe = await sh(
        agent,
        "env; cat /proc/1/environ; echo; tr '\\0' '\\n' < /proc/self/environ; "
        "echo x > /proc/1/fd/2 && echo WROTE-AGENT-STDERR; echo x > /proc/1/fd/1 && echo WROTE-AGENT-STDOUT",
    )
    everything = str(probe["stdout"]) + str(probe["stderr"])
    assert sandbox.token not in everything
    assert "SANDFLEET_AGENT_TOKEN" not in everything
    assert "WROTE-AGENT" not in everything
    assert "/proc/1/environ: Permission denied" in str(probe["stderr"])


async def test_files_the_agent_writes_belong_to_the_sandbox_user(agent: httpx.AsyncClient) -> None:
    put = await agent.put("/v1/files", params={"path": "new/dir/file.txt", "mode": "4755"}, content=b"x")
    assert put.status_code == 200, put.text
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, kind in (("tree", tarfile.DIRTYPE), ("tree/sub/data.txt", tarfile.REGTYPE)):
            info = tarfile.TarInfo(name)
            info.type = kind
            info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o6755
            info.size = 0
            info.uid = info.gid = 0
            tar.addfile(info, io.BytesIO(b""))
        link = tarfile.TarInfo("tree/link")
        link.type = tarfile.SYMTYPE
        link.linkname = "sub"
        tar.addfile(link)
    upload = await agent.put("/v1/files/archive", params={"path": "up"}, content=buffer.getvalue())
    assert upload.status_code == 200, upload.text
    owners = await sh(
        agent,
        "stat -c '%u:%g %n' new new/dir new/dir/file.txt up up/tree up/tree/sub up/tree/sub/data.txt; "
        "stat -c '%u:%g %n' up/tree/link",
    )
    lines = str(owners["stdout"]).splitlines()
    assert len(lines) == 8, owners
    assert all(line.startswith("1000:1000 ") for line in lines), lines
    edit = await sh(agent, "echo more >> new/dir/file.txt && echo more >> up/tree/sub/data.txt && echo ok")
    assert str(edit["stdout"]).strip() == "ok"
