"""Servers the tests start: a free port, a real `sandfleet serve --local`, waiting for /readyz."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support.kube import wait_until


def wait_until_ready(
    url: str, process: subprocess.Popen[bytes], log: Path, timeout: float, what: str
) -> None:
    """Poll `url`/readyz until it answers 200; an exited process fails at once with its log tail."""

    def ready() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"{what}: the process exited:\n{log.read_text()[-3000:]}")
        try:
            return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(ready, timeout=timeout, what=what)


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_local_serve(directory: Path) -> tuple[str, subprocess.Popen[bytes], Path]:
    """A real `sandfleet serve --local` with 2 warm sandboxes of pool `python`, token `local-token`.

    Returns its URL, its process and its log, once it has a warm sandbox.
    """
    port = free_port()
    tokens = directory / "tokens"
    tokens.write_text("local-token actor-0\n")
    log = directory / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "sandfleet.cli", "serve", "--local", "--port", str(port),
             "--warm", "2", "--pool", "python", "--token-file", str(tokens)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_until_ready(url, process, log, timeout=120, what="sandfleet serve to have a warm sandbox")
    return url, process, log


def stop_local_serve(process: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM, and a clean exit: uvicorn shuts down gracefully, then re-raises the signal."""
    process.terminate()
    assert process.wait(timeout=60) in (0, -15), log.read_text()[-3000:]
