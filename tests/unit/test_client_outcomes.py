"""The client's typed errors and evaluation outcomes, from plain response bodies."""

from __future__ import annotations

from typing import Any

import pytest

from sandfleet.client import (
    Evaluation,
    ExecResult,
    NotFound,
    Outcome,
    SandboxError,
    SandboxLost,
    error_for,
)


@pytest.mark.parametrize(
    "body",
    [
        {"error": "file_not_found", "detail": "no such file: 'x'", "source": "sandbox"},
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


def test_an_evaluation_is_typed_and_still_reads_like_the_response() -> None:
    raw = {"outcome": "timed_out", "reward": 0.0, "counts": {"passed": 2}, "tests": [], "exec": {"x": 1}}
    result = Evaluation.of(raw)
    assert result.outcome is Outcome.TIMED_OUT
    assert result.usable
    assert result["exec"] == {"x": 1}
    assert result.get("reward") == 0.0
    assert dict(result) == raw
    legacy = Evaluation.of({"reward": 1.0})
    assert legacy.outcome is Outcome.PASSED


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (error_for(502, {"error": "sandbox_lost", "detail": "gone"}), Outcome.INFRA_ERROR),
        (error_for(503, {"error": {"code": "processes_survive", "message": "m"}}), Outcome.INFRA_ERROR),
        (error_for(422, {"error": {"code": "no_test_command", "message": "m"}}), Outcome.INFRA_ERROR),
        (error_for(422, {"error": {"code": "bad_patch", "message": "m"}}), Outcome.FAILED),
        (error_for(400, {"error": {"code": "bad_request", "message": "m"}}), None),
    ],
)
def test_score_masks_the_fleets_failures_and_scores_the_episodes(
    error: Any, expected: Outcome | None
) -> None:
    scored = Evaluation.of_error(error)
    if expected is None:
        assert scored is None
        return
    assert scored is not None
    assert (scored.outcome, scored.reward) == (expected, 0.0)
    assert scored.usable == (expected is not Outcome.INFRA_ERROR)


def test_exec_output_in_base64_is_exact() -> None:
    result = ExecResult.of({"stdout": "/wA=", "stderr": "", "encoding": "base64", "stdout_truncated": True})
    assert result.data() == b"\xff\x00"
    assert result.truncated
