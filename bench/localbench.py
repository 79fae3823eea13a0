"""Shared helpers for the local-runtime benchmarks: builds what they need, logs progress, percentiles."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "operator"))

from sandfleet.local.artifacts import ImageRef, ensure_base_image, ensure_runsc  # noqa: E402


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_serve(url: str, server: subprocess.Popen[bytes], server_log: Path, timeout: float) -> None:
    """Until `sandfleet serve` at `url` is ready and still ours (exits with its log if it is not)."""
    deadline = time.monotonic() + timeout
    while True:
        # Ready, and still ours: a server that died on a taken port leaves another one answering.
        try:
            ready = httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.TransportError:
            ready = False
        if ready and server.poll() is None:
            return
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("serve did not get ready:\n" + server_log.read_text(errors="replace")[-3000:])
        time.sleep(0.5)


@contextlib.contextmanager
def serving_tasks(workdir: Path, warm: int, *extra: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`sandfleet serve --local --tasks` on a free port for the block (its URL); SIGTERM after.

    The first run builds runsc and the images, hence the long wait; its log is `workdir/serve.log`.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server_log = workdir / "serve.log"
    argv = [str(REPO / ".venv" / "bin" / "sandfleet"), "serve", "--local", "--tasks", "--port", str(port)]
    with server_log.open("wb") as out:
        server = subprocess.Popen(
            [*argv, "--warm", str(warm), *extra], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO
        )
    try:
        wait_for_serve(url, server, server_log, 1200)
        yield url
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def log(name: str, message: str) -> None:
    """Progress on stderr; stdout is kept for the final JSON line."""
    print(f"[bench {name}] {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def summary(values: list[float], prefix: str) -> dict[str, float]:
    """p50, p99, mean and max of a sample, rounded to microseconds, named after the figure."""
    return {
        f"{prefix}_p50_s": round(percentile(values, 50), 6),
        f"{prefix}_p99_s": round(percentile(values, 99), 6),
        f"{prefix}_mean_s": round(statistics.fmean(values), 6),
        f"{prefix}_max_s": round(max(values), 6),
    }


def samples(values: list[float], most: int = 400, scale: float = 1000.0) -> list[float]:
    """A sorted sample thinned to at most `most` evenly spaced quantiles, in ms: enough for a plot."""
    ordered = sorted(values)
    if len(ordered) > most:
        step = (len(ordered) - 1) / (most - 1)
        ordered = [ordered[round(i * step)] for i in range(most)]
    return [round(v * scale, 3) for v in ordered]


async def prepare(name: str) -> tuple[Path, ImageRef, str]:
    """runsc, the base image, and runsc's version line (all built on demand, cached)."""
    log(name, "ensuring runsc and the sandbox image are built (cached after the first run)")
    runsc = await ensure_runsc()
    image = await ensure_base_image()
    version = await asyncio.to_thread(
        lambda: subprocess.run([str(runsc), "--version"], capture_output=True, text=True, check=True).stdout
    )
    return runsc, image, version.splitlines()[0]
