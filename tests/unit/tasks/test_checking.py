"""`task check`'s verdicts from evaluations: the bug must fail its tests, the fix and the clean tree pass."""

from __future__ import annotations

from sandfleet.tasks.catalogue import parse_catalogue
from sandfleet.tasks.checking import (
    TaskCheck,
    bug_problems,
    outcomes,
    passing_problems,
    summary,
)
from tests.unit.tasks.test_catalogue import VALID

TASK = parse_catalogue(VALID, "c.yaml").tasks[0]


def test_the_bug_must_score_zero_and_fail_its_tests() -> None:
    assert bug_problems(TASK, 0.0, {"t::a": "failed", "t::b": "passed"}) == []
    assert bug_problems(TASK, 0.0, {"t::b": "passed"}) == []  # a test lost to a crash did not pass
    problems = bug_problems(TASK, 1.0, {"t::a": "passed"})
    assert len(problems) == 2
    assert "not 0" in problems[0]
    assert "t::a" in problems[1]


def test_the_fix_must_score_one_and_pass_fail_to_pass_and_pass_to_pass() -> None:
    expected = TASK.deciding()
    assert expected == ["t::a", "t::b", "t::c"]
    all_pass = dict.fromkeys(expected, "passed")
    assert passing_problems("fixed", 1.0, all_pass, expected) == []
    problems = passing_problems("fixed", 1.0, {**all_pass, "t::c": "skipped"}, expected)
    assert problems == ["fixed: 1 tests do not pass, e.g. t::c (skipped)"]
    assert "missing" in passing_problems("fixed", 0.0, {"t::a": "passed"}, expected)[1]


def test_outcomes_and_summary() -> None:
    assert outcomes([{"name": "t::a", "outcome": "failed"}]) == {"t::a": "failed"}
    checks = [TaskCheck("a", (), 1, 3, 1.5), TaskCheck("b", ("bad",), 0, 0, 0.5)]
    assert summary(checks) == "1/2 tasks verified in gVisor (2.0 s of evaluation)"
