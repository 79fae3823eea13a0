"""What `task check` concludes from a task's evaluations (bug, fix, clean tree): data in, problems out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sandfleet.tasks.catalogue import Task


@dataclass(frozen=True)
class TaskCheck:
    """One task's verdict: the problems found (none: verified) and the counts behind them."""

    task: str
    problems: tuple[str, ...]
    bug_failing: int
    fixed_passing: int
    seconds: float

    @property
    def verified(self) -> bool:
        return not self.problems


def outcomes(tests: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """`name -> outcome` from an evaluation's per-test list (the agent reads them from JUnit)."""
    return {str(t.get("name")): str(t.get("outcome")) for t in tests}


def bug_problems(task: Task, reward: float, tests: Mapping[str, str]) -> list[str]:
    """With the bug, the reward is 0 and every FAIL_TO_PASS test does not pass."""
    problems = []
    if reward != 0.0:
        problems.append(f"with the bug the reward is {reward}, not 0")
    still_passing = [t for t in task.fail_to_pass if tests.get(t) == "passed"]
    if still_passing:
        problems.append(f"with the bug {len(still_passing)} FAIL_TO_PASS tests pass, e.g. {still_passing[0]}")
    return problems


def passing_problems(
    what: str, reward: float, tests: Mapping[str, str], expected: Sequence[str]
) -> list[str]:
    """With the fix (or on the clean tree), the reward is 1 and every expected test passes."""
    problems = []
    if reward != 1.0:
        problems.append(f"{what}: the reward is {reward}, not 1")
    failing = [t for t in expected if tests.get(t) != "passed"]
    if failing:
        shown = failing[0]
        problems.append(
            f"{what}: {len(failing)} tests do not pass, e.g. {shown} ({tests.get(shown, 'missing')})"
        )
    return problems


def summary(checks: Sequence[TaskCheck]) -> str:
    verified = sum(1 for c in checks if c.verified)
    seconds = sum(c.seconds for c in checks)
    return f"{verified}/{len(checks)} tasks verified in gVisor ({seconds:.1f} s of evaluation)"
