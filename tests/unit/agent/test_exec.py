"""Exec through the agent's HTTP API: argv and shell, cwd, env, stdin, timeouts, caps, errors."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.unit.agent.conftest import REPO, Agent, wait_dead


def test_health_and_ready(agent: Agent) -> None:
    health = agent.client.get("/v1/health").json()
    # Unauthenticated, so it names nothing about the sandbox (no root, uid or pid).
    assert health == {"status": "ok", "version": health["version"]}
    ready = agent.client.get("/v1/ready")
    assert ready.status_code == 200
    assert ready.json()["ready"] is True
    assert ready.json()["exit_code"] == 0


def test_argv_exec_reports_exit_code_output_and_duration(agent: Agent) -> None:
    response = agent.exec(argv=["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert response.status_code == 200
    body = response.json()
    assert body["exit_code"] == 7
    assert body["stdout"] == "out\n"
    assert body["stderr"] == "err\n"
    assert body["timed_out"] is False
    assert body["stdout_truncated"] is False
    assert body["duration_s"] >= 0


def test_shell_cwd_env_and_stdin(agent: Agent) -> None:
    (agent.root / "sub").mkdir()
    body = agent.exec(
        shell='pwd; echo "$GREETING"; cat',
        cwd="sub",
        env={"GREETING": "hello"},
        stdin="from stdin",
    ).json()
    assert body["stdout"].splitlines() == [str(agent.root.resolve() / "sub"), "hello", "from stdin"]


def test_large_stdin_is_fed_while_output_is_read(agent: Agent) -> None:
    payload = "x" * (3 << 20)
    body = agent.exec(argv=["wc", "-c"], stdin=payload).json()
    assert body["stdout"].strip() == str(len(payload))


def test_signal_exit_is_reported(agent: Agent) -> None:
    body = agent.exec(shell="kill -TERM $$").json()
    assert body["signal"] == 15
    assert body["exit_code"] == 128 + 15


def test_timeout_kills_the_whole_process_group(agent: Agent) -> None:
    marker, partial = agent.root / "pids", agent.root / "pids.part"
    started = time.monotonic()
    # Both pids are in the marker (renamed into place whole) before the command only sleeps, and
    # the timeout leaves the shell seconds for that, so it never fires before the marker exists.
    body = agent.exec(
        shell=f"sleep 60 & echo $! > {partial}; setsid sleep 61 & echo $! >> {partial}; "
        f"mv {partial} {marker}; sleep 62",
        timeout_s=5,
    ).json()
    assert time.monotonic() - started < 30  # the timeout, not sleep 62, ended it
    assert body["timed_out"] is True
    assert body["killed"] is True
    assert body["signal"] == 9
    pids = [int(pid) for pid in marker.read_text().split()]
    assert len(pids) == 2
    for pid in pids:
        assert wait_dead(pid), f"process {pid} outlived the timeout"


def test_backgrounded_child_does_not_hold_the_call(agent: Agent) -> None:
    started = time.monotonic()
    body = agent.exec(shell="sleep 30 & echo started").json()
    assert time.monotonic() - started < 5
    assert body["exit_code"] == 0
    assert body["stdout"] == "started\n"


def test_output_cap_sets_truncated_and_counts_everything(agent: Agent) -> None:
    body = agent.exec(shell="head -c 100000 /dev/zero | tr '\\0' a", max_output_bytes=1000).json()
    assert len(body["stdout"]) == 1000
    assert body["stdout_truncated"] is True
    assert body["stdout_bytes"] == 100000
    assert body["exit_code"] == 0


def test_binary_output_is_flagged_and_available_as_base64(agent: Agent) -> None:
    text = agent.exec(shell="printf '\\377\\376ok'").json()
    assert text["stdout_binary"] is True
    raw = agent.exec(shell="printf '\\377\\376ok'", encoding="base64").json()
    assert base64.b64decode(raw["stdout"]) == b"\xff\xfeok"


def test_stdin_base64(agent: Agent) -> None:
    body = agent.exec(argv=["od", "-An", "-tx1"], stdin_base64=base64.b64encode(b"\x00\xff").decode()).json()
    assert body["stdout"].split() == ["00", "ff"]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"argv": ["definitely-not-a-command"]}, 422, "command_not_found"),
        ({"argv": ["true"], "cwd": "missing"}, 422, "bad_cwd"),
        ({"argv": ["true"], "cwd": "../.."}, 403, "path_outside_root"),
        ({}, 400, "bad_request"),
        ({"argv": ["true"], "shell": "true"}, 400, "bad_request"),
        ({"argv": []}, 400, "bad_request"),
        ({"argv": "true"}, 400, "bad_request"),
        ({"argv": ["true"], "timeout_s": -1}, 400, "bad_request"),
        ({"argv": ["true"], "env": {"A": 1}}, 400, "bad_request"),
        ({"argv": ["true"], "stdin_base64": "!!"}, 400, "bad_request"),
    ],
)
def test_bad_exec_requests_get_clear_errors(
    agent: Agent, body: dict[str, object], status: int, code: str
) -> None:
    response = agent.client.post("/v1/exec", json=body)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert response.json()["error"]["message"]


@pytest.mark.parametrize(("content", "mode"), [(b"plain text", 0o644), (b"\x00\x01binary", 0o755)])
def test_non_executable_file_is_a_clear_error(agent: Agent, content: bytes, mode: int) -> None:
    target = agent.root / "not-a-program"
    target.write_bytes(content)
    target.chmod(mode)
    response = agent.exec(argv=["./not-a-program"])
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "command_not_executable"


def test_malformed_json_and_unknown_routes(agent: Agent) -> None:
    bad = agent.client.post("/v1/exec", content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == "bad_json"
    assert agent.client.get("/v1/nope").status_code == 404
    assert agent.client.get("/v1/exec").status_code == 405
    # The connection survives errors: keep-alive still works.
    assert agent.exec(argv=["true"]).json()["exit_code"] == 0


def test_stream_emits_start_output_and_exit_events(agent: Agent) -> None:
    events = []
    with agent.client.stream(
        "POST", "/v1/exec/stream", json={"shell": "echo one; sleep 0.2; echo two >&2; exit 3"}
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/x-ndjson"
        events = [json.loads(line) for line in response.iter_lines() if line]
    assert events[0]["event"] == "start"
    assert events[0]["pid"] > 0
    assert {"event": "stdout", "data": "one\n"} in events
    assert {"event": "stderr", "data": "two\n"} in events
    assert events[-1]["event"] == "exit"
    assert events[-1]["exit_code"] == 3


def test_stream_timeout_and_error_before_start(agent: Agent) -> None:
    with agent.client.stream(
        "POST", "/v1/exec/stream", json={"shell": "sleep 30", "timeout_s": 0.3}
    ) as response:
        events = [json.loads(line) for line in response.iter_lines() if line]
    assert events[-1]["timed_out"] is True
    missing = agent.client.post("/v1/exec/stream", json={"argv": ["no-such-command"]})
    assert missing.status_code == 422
    assert missing.json()["error"]["code"] == "command_not_found"


@pytest.mark.parametrize("cap", [256 << 20, 1024])
def test_a_stream_its_client_abandons_is_killed_even_past_the_output_cap(agent: Agent, cap: int) -> None:
    # Past the cap nothing is written, so only a look at the connection can tell the client left.
    with agent.client.stream(
        "POST", "/v1/exec/stream", json={"shell": "yes flood", "max_output_bytes": cap, "timeout_s": 120}
    ) as response:
        lines = response.iter_lines()
        pid = json.loads(next(lines))["pid"]
        next(lines)
    assert wait_dead(pid, timeout=10), "the abandoned command kept running"


def test_bearer_token_guards_everything_but_probes(tmp_path: object) -> None:
    from pathlib import Path

    from tests.unit.agent.conftest import start_agent, stop_agent

    base = Path(str(tmp_path))
    token_file = base / "token"
    token_file.write_text("s3cret\n")
    agent = start_agent(base, "--token-file", str(token_file))
    try:
        assert agent.client.get("/v1/ready").status_code == 200
        denied = agent.exec(argv=["true"])
        assert denied.status_code == 401
        assert denied.json()["error"]["code"] == "unauthorized"
        allowed = agent.client.post(
            "/v1/exec", json={"argv": ["true"]}, headers={"Authorization": "Bearer s3cret"}
        )
        assert allowed.status_code == 200
    finally:
        stop_agent(agent)


def test_stdin_and_output_larger_than_pipe_buffers_do_not_deadlock(agent: Agent) -> None:
    payload = "y" * (4 << 20)
    body = agent.exec(argv=["cat"], stdin=payload, max_output_bytes=8 << 20, timeout_s=30).json()
    assert body["timed_out"] is False
    assert body["stdout_bytes"] == len(payload)
    assert body["stdout"] == payload


def test_an_agent_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SANDFLEET_AGENT_TOKEN"}
    env["PYTHONPATH"] = str(REPO / "sandbox_image")
    (tmp_path / "ws").mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "sandfleet_agent", "--port", "0", "--root", str(tmp_path / "ws")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "no bearer token: set SANDFLEET_AGENT_TOKEN or pass --token-file" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_agents_token_is_not_in_a_commands_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.unit.agent.conftest import start_agent, stop_agent

    monkeypatch.setenv("SANDFLEET_AGENT_TOKEN", "t0ken-in-env")
    agent = start_agent(tmp_path)
    try:
        assert agent.exec(argv=["true"]).status_code == 401
        seen = agent.client.post(
            "/v1/exec", json={"argv": ["env"]}, headers={"Authorization": "Bearer t0ken-in-env"}
        ).json()
        assert "t0ken-in-env" not in seen["stdout"]
        assert "SANDFLEET_AGENT_TOKEN" not in seen["stdout"]
    finally:
        stop_agent(agent)
