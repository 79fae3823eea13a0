"""Runs the agent as a real subprocess on the host, with a temporary working area, for each test."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.servers import free_port

REPO = Path(__file__).resolve().parents[3]


@dataclass
class Agent:
    """A running agent and a client for it."""

    url: str
    root: Path
    logs: Path
    client: httpx.Client
    proc: subprocess.Popen[bytes]

    def exec(self, **body: object) -> httpx.Response:
        return self.client.post("/v1/exec", json=body)


def start_agent(tmp_path: Path, *extra: str) -> Agent:
    root = tmp_path / "workspace"
    logs = tmp_path / "logs"
    root.mkdir()
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO / "sandbox_image")}
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "sandfleet_agent", "--host", "127.0.0.1", "--port", str(port)),
            *("--root", str(root), "--logs-dir", str(logs)),
            # On the host the agent must not switch users (or sweep a uid's processes): the gVisor
            # suites in tests/security prove the split.
            *("--exec-user", "none", "--verifier-user", "none", *extra),
            *(() if "--token-file" in extra else ("--insecure-no-token",)),
        ],
        env=env,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=url, timeout=30)
    deadline = time.monotonic() + 15
    while True:
        try:
            if client.get("/v1/health").status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the agent did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
        time.sleep(0.02)
    return Agent(url=url, root=root, logs=logs, client=client, proc=proc)


def stop_agent(agent: Agent) -> None:
    agent.client.close()
    agent.proc.terminate()
    try:
        agent.proc.wait(10)
    except subprocess.TimeoutExpired:
        agent.proc.kill()
        agent.proc.wait()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    running = start_agent(tmp_path)
    yield running
    stop_agent(running)


def pid_alive(pid: int) -> bool:
    """True while a process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            raw = stat.read()
    except (FileNotFoundError, ProcessLookupError):  # the read fails with ESRCH if it exits after the open
        return False
    return raw[raw.rfind(b")") + 2 : raw.rfind(b")") + 3] != b"Z"


def wait_dead(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.02)
    return False
