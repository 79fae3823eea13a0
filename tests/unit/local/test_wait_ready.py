"""A booting sandbox's agent is asked /v1/ready until it says so, or the timeout is up (no runsc needed)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from sandfleet.core.limits import SandboxLimits
from sandfleet.local.artifacts import ImageRef
from sandfleet.local.errors import LocalRuntimeError
from sandfleet.local.runtime import READY_POLL_S, LocalRuntime, RunscSandbox

SANDBOX = RunscSandbox("sb1", 1, "10.77.0.2", 8000, Path("/nonexistent"), SandboxLimits())
Answer = Callable[[int], httpx.Response]  # the answer to the nth question (1 the first)


def runtime(tmp_path: Path, answer: Answer, timeout_s: float) -> tuple[LocalRuntime, list[str]]:
    """A runtime whose agents all answer `answer`; what they were asked."""
    made = LocalRuntime(
        ImageRef(tmp_path, "agent", "sha256:0"),
        Path("/nonexistent/runsc"),
        state_dir=tmp_path,
        ready_timeout_s=timeout_s,
    )
    asked: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        return answer(len(asked))

    made._client = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    return made, asked


def refused(n: int) -> httpx.Response:
    raise httpx.ConnectError("connection refused")  # the agent is not listening yet


def busy(n: int) -> httpx.Response:
    return httpx.Response(503)


async def test_an_agent_still_starting_is_asked_again_until_it_is_ready(tmp_path: Path) -> None:
    def answer(n: int) -> httpx.Response:
        return refused(n) if n <= 2 else busy(n) if n == 3 else httpx.Response(200)

    booting, asked = runtime(tmp_path, answer, timeout_s=5.0)
    await booting._wait_ready(SANDBOX)
    assert asked == ["http://10.77.0.2:8000/v1/ready"] * 4


@pytest.mark.parametrize(("answer", "problem"), [(busy, "/v1/ready answered 503"), (refused, "ConnectError")])
async def test_an_agent_never_ready_fails_the_boot_after_the_timeout_saying_why(
    tmp_path: Path, answer: Answer, problem: str
) -> None:
    never, asked = runtime(tmp_path, answer, timeout_s=0.1)
    started = time.monotonic()
    with pytest.raises(
        LocalRuntimeError, match=rf"not ready within 0 s \({problem}\); agent log: \(no log\)"
    ):
        await never._wait_ready(SANDBOX)
    # No question is asked after the timeout, and none is skipped before it.
    assert 0.1 - READY_POLL_S <= time.monotonic() - started < 0.1 + 0.05
    assert 1 < len(asked) <= 0.1 / READY_POLL_S + 1


async def test_anything_but_a_connection_error_ends_the_wait_at_once(tmp_path: Path) -> None:
    def garbled(n: int) -> httpx.Response:
        raise httpx.DecodingError("garbled")

    broken, asked = runtime(tmp_path, garbled, timeout_s=5.0)
    with pytest.raises(httpx.DecodingError):
        await broken._wait_ready(SANDBOX)
    assert len(asked) == 1
