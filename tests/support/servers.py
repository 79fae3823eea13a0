"""Servers the tests start: a free port, a real `sandfleet serve --local`, waiting for /readyz."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
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


def start_local_serve(
    directory: Path,
    tokens: Mapping[str, str] | None = None,
    *,
    warm: int = 2,
    settings: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = 120,
) -> tuple[str, subprocess.Popen[bytes], Path]:
    """A real `sandfleet serve --local` with `warm` sandboxes of pool `python`.

    `tokens` maps each tenant's name to its static token (default: `actor-0` with `local-token`);
    `settings` are SANDFLEET_GATEWAY_* variables laid over this environment. Returns its URL, its
    process and its log, once it has a warm sandbox.
    """
    port = free_port()
    token_file = directory / "tokens"
    named = tokens if tokens is not None else {"actor-0": "local-token"}
    token_file.write_text("".join(f"{token} {name}\n" for name, token in named.items()))
    log = directory / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "sandfleet.cli", "serve", "--local", "--port", str(port),
             "--warm", str(warm), "--pool", "python", "--token-file", str(token_file), *extra_args],
            env={**os.environ, **(settings or {})}, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, process, log, timeout=timeout, what="sandfleet serve to have a warm sandbox")
    except BaseException:
        if process.poll() is None:
            stop_local_serve(process, log)
        raise
    return url, process, log


def stop_local_serve(process: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM, and a clean exit that leaves none of its gVisor sandboxes behind.

    uvicorn shuts down gracefully, then re-raises the signal. Only this serve's own sandboxes are
    counted (those under its runtime instance), so another serve on the host cannot fail it.
    """
    instance = serve_instance(process.pid) if process.poll() is None else None
    process.terminate()
    assert process.wait(timeout=60) in (0, -15), log.read_text()[-3000:]
    if instance is not None:
        left = runsc_sandboxes(instance)
        assert left == 0, f"serve left {left} gVisor sandboxes of its instance {instance} behind"


def serve_instance(pid: int) -> str | None:
    """The local runtime instance a running serve owns: it holds instances/<id>/lock open (a flock)."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = Path(os.readlink(fd))
        except OSError:
            continue
        if target.name == "lock" and target.parent.parent.name == "instances":
            return target.parent.name
    return None


def runsc_sandboxes(instance: str) -> int:
    """gVisor sandbox processes of one local runtime instance on this host.

    Leaks show as processes, not in `runsc list`; an instance's sandboxes run with its runsc root,
    `--root=<state>/instances/<id>/runsc`.
    """
    marker = f"/instances/{instance}/runsc "
    count = 0
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit():
                continue
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if command.startswith("runsc-sandbox") and marker in command:
            count += 1
    return count
