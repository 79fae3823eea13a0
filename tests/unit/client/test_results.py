"""The client's results from plain answers: typed outcomes, the score an error amounts to, exec bytes."""

from __future__ import annotations

from typing import Any

import pytest

from sandfleet.client import Evaluation, ExecResult, Outcome, error_for


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
