"""`task check` over one sandbox: evaluate the bug, write the fix, evaluate again (scripted sandbox)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sandfleet.cli.task_factory_commands import _check_one
from sandfleet.client import Evaluation
from sandfleet.tasks.catalogue import parse_catalogue
from tests.unit.tasks.test_catalogue import VALID

TASK = parse_catalogue(VALID, "c.yaml").tasks[0]
CWD = "/workspace/tasks/demo-1.0-one"


class ScriptedSandbox:
    """A sandbox whose tests pass exactly when demo.py holds the original line."""

    def __init__(self, fixed_breaks: str | None = None) -> None:
        self.files = {f"{CWD}/demo.py": b"if x >= 1:\n    pass\n"}
        self.fixed_breaks = fixed_breaks
        self.bodies: list[dict[str, Any]] = []

    async def read_file(self, path: str) -> bytes:
        return self.files[path]

    async def write_file(self, path: str, data: bytes | str) -> None:
        self.files[path] = data.encode() if isinstance(data, str) else data

    async def evaluate(self, **body: Any) -> Evaluation:
        self.bodies.append(body)
        fixed = b"x < 1" in self.files[f"{CWD}/demo.py"]
        tests = {"t::a": fixed, "t::b": True, "t::c": not (fixed and self.fixed_breaks == "t::c")}
        outcome = all(tests.values())
        return Evaluation.of(
            {
                "outcome": "passed" if outcome else "failed",
                "reward": 1.0 if outcome else 0.0,
                "tests": [{"name": n, "outcome": "passed" if ok else "failed"} for n, ok in tests.items()],
            }
        )


class ScriptedFleet:
    def __init__(self, sandbox: ScriptedSandbox) -> None:
        self.sandbox = sandbox

    @asynccontextmanager
    async def lease(self, pool: str, **options: Any) -> AsyncIterator[ScriptedSandbox]:
        yield self.sandbox


def test_a_sound_task_is_verified_with_two_evaluations_scored_as_episodes_are() -> None:
    sandbox = ScriptedSandbox()
    check = asyncio.run(_check_one(ScriptedFleet(sandbox), TASK, "p", 5.0))  # type: ignore[arg-type]
    assert check.verified, check.problems
    assert (check.bug_failing, check.fixed_passing) == (1, 3)
    assert sandbox.files[f"{CWD}/demo.py"] == b"if x < 1:\n    pass\n"
    # The very object the loop sends: the catalogue's scoring, its deciding tests, from the pristine copy.
    assert sandbox.bodies == [{"task": TASK.scoring()}] * 2
    scoring = TASK.scoring()
    assert scoring["tree"] == CWD
    assert scoring["pristine"] == "/opt/sandfleet/pristine/workspace/tasks/demo-1.0-one"
    assert scoring["pythonpath"] == [
        "/opt/sandfleet/pristine/workspace/.deps",
        ".",
        "/opt/sandfleet/pristine/workspace/.requires/demo-1.0",
    ]
    assert scoring["deciding"] == ["t::a", "t::b", "t::c"]


def test_a_fix_that_breaks_a_pass_to_pass_test_is_not_verified() -> None:
    sandbox = ScriptedSandbox(fixed_breaks="t::c")
    check = asyncio.run(_check_one(ScriptedFleet(sandbox), TASK, "p", 5.0))  # type: ignore[arg-type]
    assert not check.verified
    assert any("t::c" in p for p in check.problems)
