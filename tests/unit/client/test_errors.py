"""The client's typed errors, from plain response bodies: the gateway's Problems and an agent's own shape."""

from __future__ import annotations

from typing import Any

import pytest

from sandfleet.client import NotFound, QueueFull, SandboxError, SandboxLost, error_for
from sandfleet.wire import FROM_SANDBOX, ProblemAnswer


@pytest.mark.parametrize(
    "body",
    [
        {"error": "file_not_found", "detail": "no such file: 'x'", "source": FROM_SANDBOX},
        {"error": {"code": "file_not_found", "message": "no such file: 'x'"}},  # an agent's own shape
    ],
)
def test_a_refusal_from_inside_the_sandbox_is_a_typed_sandbox_error(body: dict[str, Any]) -> None:
    error = error_for(404, body)
    assert type(error) is SandboxError
    assert (error.code, error.detail) == ("file_not_found", "no such file: 'x'")
    assert not error.infrastructure


def test_the_gateways_own_errors_keep_their_classes() -> None:
    missing = error_for(404, {"error": "not_found", "detail": "no lease l-1"})
    assert type(missing) is NotFound
    assert missing.code == "not_found"
    lost = error_for(502, {"error": "sandbox_lost", "detail": "gone"})
    assert type(lost) is SandboxLost
    assert lost.infrastructure
    odd = error_for(500, ["not", "an", "object"])
    assert odd.code == "error"
    assert "HTTP 500" in odd.detail


def test_a_full_queue_says_when_to_come_back() -> None:
    problem: ProblemAnswer = {
        "error": "queue_full",
        "detail": "the pool's queue is full",
        "queue_position": 9,
        "eta_seconds": 3.5,
        "retry_after_seconds": 4,
    }
    error = error_for(429, problem)
    assert isinstance(error, QueueFull)
    assert (error.code, error.retry_after) == ("queue_full", 4)
    bare = error_for(429, {"error": "quota_exceeded", "detail": "over quota"})
    assert isinstance(bare, QueueFull)
    assert bare.retry_after == 1  # no hint: come back in a second
