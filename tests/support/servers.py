"""Waiting for a server process we started to answer /readyz, failing with its log if it dies."""

from __future__ import annotations

import subprocess
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
