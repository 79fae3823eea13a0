"""Every agent operation, through a real gVisor sandbox made by the local runtime."""

from __future__ import annotations

import base64
import io
import json
import tarfile

import httpx
import pytest

from sandfleet.local.runtime import RunscSandbox
from tests.e2e.local.conftest import sh

pytestmark = pytest.mark.gvisor

BUGGY = "def add(a, b):\n    return a - b\n"
PATCH = (
    "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
)


async def test_health_and_ready_from_inside_the_sandbox(
    agent: httpx.AsyncClient, sandbox: RunscSandbox
) -> None:
    # Health is unauthenticated, so it only says the agent serves; who and where come from exec.
    assert (await agent.get("/v1/health")).json()["status"] == "ok"
    inside = await agent.post("/v1/exec", json={"shell": "id -u; pwd; grep -E '^Uid:' /proc/1/status"})
    uid, cwd, pid1 = inside.json()["stdout"].splitlines()
    assert (uid, cwd, pid1.split()[1]) == ("1000", "/workspace", "0")
    ready = await agent.get("/v1/ready")
    assert ready.status_code == 200
    assert ready.json()["exit_code"] == 0
    assert sandbox.timings["total_s"] > 0


async def test_the_agent_boots_from_its_bytecode(agent: httpx.AsyncClient) -> None:
    # Bytecode that does not match its source is ignored: each boot would compile the agent again.
    body = await sh(
        agent, "PYTHONPATH=/opt/sandfleet/agent python3 -v -c 'import sandfleet_agent.server' 2>&1"
    )
    loaded = [
        line
        for line in body["stdout"].splitlines()
        if "code object from" in line and "sandfleet_agent" in line
    ]
    assert loaded, body["stdout"][-2000:]
    assert all(".pyc'" in line for line in loaded), [line for line in loaded if ".pyc'" not in line]


async def test_exec_argv_shell_cwd_env_stdin(agent: httpx.AsyncClient) -> None:
    await sh(agent, "mkdir -p /workspace/sub")
    body = await sh(
        agent, 'pwd; echo "$WHO"; cat; exit 4', cwd="sub", env={"WHO": "episode-7"}, stdin="piped"
    )
    assert body["stdout"] == "/workspace/sub\nepisode-7\npiped"
    assert body["exit_code"] == 4
    argv = (await agent.post("/v1/exec", json={"argv": ["python3", "-c", "print(6*7)"]})).json()
    assert argv["stdout"] == "42\n"


async def test_timeout_kills_the_process_group_inside_the_sandbox(agent: httpx.AsyncClient) -> None:
    body = await sh(agent, "sleep 300 & setsid sleep 301 & sleep 302", timeout_s=0.5)
    assert body["timed_out"] is True
    assert body["signal"] == 9
    left = await sh(agent, "ps -eo args | grep -c '^sleep 30[0-9]' || true")
    assert left["stdout"].strip() == "0"


async def test_output_cap_and_binary_output(agent: httpx.AsyncClient) -> None:
    capped = await sh(agent, "head -c 5000000 /dev/urandom | base64", max_output_bytes=4096)
    assert capped["stdout_truncated"] is True
    assert len(capped["stdout"]) == 4096
    assert capped["stdout_bytes"] > 5_000_000
    raw = await sh(agent, "printf '\\000\\377'", encoding="base64")
    assert base64.b64decode(str(raw["stdout"])) == b"\x00\xff"


async def test_clear_errors(agent: httpx.AsyncClient) -> None:
    missing = await agent.post("/v1/exec", json={"argv": ["no-such-tool"]})
    assert (missing.status_code, missing.json()["error"]["code"]) == (422, "command_not_found")
    outside = await agent.get("/v1/files", params={"path": "../etc/passwd"})
    assert (outside.status_code, outside.json()["error"]["code"]) == (403, "path_outside_root")
    bad_patch = await agent.post("/v1/evaluate", json={"patch": "garbage", "shell": "true"})
    assert (bad_patch.status_code, bad_patch.json()["error"]["code"]) == (422, "bad_patch")


async def test_streaming_exec(agent: httpx.AsyncClient) -> None:
    async with agent.stream(
        "POST", "/v1/exec/stream", json={"shell": "echo first; sleep 0.3; echo second"}
    ) as response:
        events = [json.loads(line) async for line in response.aiter_lines() if line]
    assert [event["event"] for event in events] == ["start", "stdout", "stdout", "exit"]
    assert events[-1]["exit_code"] == 0


async def test_background_job_poll_tail_and_kill(agent: httpx.AsyncClient) -> None:
    job = (await agent.post("/v1/jobs", json={"shell": "echo begin; sleep 300"})).json()
    job_id = job["job_id"]
    for _ in range(100):
        output = (await agent.get(f"/v1/jobs/{job_id}/output", params={"tail": 100})).json()
        if output["data"]:
            break
    assert output["data"] == "begin\n"
    assert output["running"] is True
    killed = (await agent.post(f"/v1/jobs/{job_id}/kill")).json()
    assert killed["state"] == "killed"
    left = await sh(agent, "ps -eo args | grep -c '^sleep 300' || true")
    assert left["stdout"].strip() == "0"

    short = (await agent.post("/v1/jobs", json={"argv": ["sh", "-c", "echo done; exit 3"]})).json()
    waited = (await agent.get(f"/v1/jobs/{short['job_id']}/wait", params={"timeout_s": 30})).json()
    assert (waited["state"], waited["exit_code"]) == ("exited", 3)
    listed = (await agent.get("/v1/jobs")).json()["jobs"]
    assert {entry["job_id"] for entry in listed} == {job_id, short["job_id"]}
    assert (await agent.delete(f"/v1/jobs/{short['job_id']}")).json()["deleted"] is True
    assert (await agent.get(f"/v1/jobs/{short['job_id']}")).status_code == 404


async def test_files_and_tar_trees(agent: httpx.AsyncClient) -> None:
    payload = bytes(range(256)) * 64
    assert (await agent.put("/v1/files", params={"path": "data/blob"}, content=payload)).status_code == 200
    assert (await agent.get("/v1/files", params={"path": "data/blob"})).content == payload
    listing = (await agent.get("/v1/files/list", params={"path": "data"})).json()
    assert [entry["name"] for entry in listing["entries"]] == ["blob"]
    stat = (await agent.get("/v1/files/stat", params={"path": "data/blob"})).json()
    assert (stat["type"], stat["size"]) == ("file", len(payload))

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in {"repo/a.txt": b"a", "repo/b/c.txt": b"c"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
    uploaded = await agent.put("/v1/files/archive", params={"path": "."}, content=buffer.getvalue())
    assert uploaded.json()["files"] == 2
    assert (await sh(agent, "cat repo/b/c.txt"))["stdout"] == "c"
    download = await agent.get("/v1/files/archive", params={"path": "repo"})
    with tarfile.open(fileobj=io.BytesIO(download.content)) as tar:
        assert sorted(m.name for m in tar.getmembers() if m.isfile()) == ["a.txt", "b/c.txt"]
    assert (await agent.delete("/v1/files", params={"path": "repo", "recursive": "1"})).status_code == 200
    assert (await agent.get("/v1/files/stat", params={"path": "repo"})).status_code == 404


async def test_evaluate_patch_and_harbor_reward(agent: httpx.AsyncClient) -> None:
    await agent.put("/v1/files", params={"path": "calc.py"}, content=BUGGY.encode())
    script = (
        "python3 -c 'import calc; assert calc.add(2, 3) == 5' && echo 1 > /logs/verifier/reward.txt "
        "|| echo 0 > /logs/verifier/reward.txt\n"
    )
    await agent.put("/v1/files", params={"path": "tests/test.sh"}, content=script.encode())
    before = (await agent.post("/v1/evaluate", json={})).json()
    assert (before["reward"], before["reward_source"]) == (0.0, "reward_file")
    after = (await agent.post("/v1/evaluate", json={"patch": PATCH})).json()
    assert after["patch"]["applied"] is True
    assert (after["reward"], after["reward_source"]) == (1.0, "reward_file")
    assert (await sh(agent, "cat /logs/verifier/reward.txt"))["stdout"] == "1\n"
