"""The named-tests reward rule as pure decisions: what of a tree is carried into scoring, what a run earns.

A task names the tests that decide it (FAIL_TO_PASS and PASS_TO_PASS) and where its test
infrastructure lives. Its reward is 1 only if every deciding test is seen to pass, in a run whose
test infrastructure is the task's own (never the episode's), and whose results stream came
through whole: every test reported once, then an end line with the run's nonce, then nothing.
Anything else is 0. The I/O around these decisions lives in scoring.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from sandfleet_agent import wire

# Files that change how tests are found, configured or run, wherever they are in the tree.
CONFIG_NAMES = frozenset(
    {
        "conftest.py",
        "pytest.ini",
        ".pytest.ini",
        "pytest.toml",
        ".pytest.toml",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        ".coveragerc",
        "sitecustomize.py",
        "usercustomize.py",
    }
)
# Directories of caches and state a test runner reads back (`--lf`, plugins' caches, git).
CACHE_DIRS = frozenset({"__pycache__", ".pytest_cache", ".hypothesis", ".tox", ".nox", ".git"})
# What Python imports as a module: a new one outside a regular package can shadow the standard
# library, pytest or the task's dependencies for the whole test process.
MODULE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyw", ".so", ".pyd")


def infrastructure(relative: str, test_paths: Iterable[str]) -> str | None:
    """Why a path of the tree belongs to the task's test infrastructure, or None if it does not.

    `relative` is a path inside the tree (`/`-separated, no `.` or `..`); `test_paths` are the
    task's test directories or files (`tests`, `src/isodate/tests`).
    """
    parts = relative.split("/")
    if any(part in CACHE_DIRS for part in parts[:-1]) or parts[-1] in CACHE_DIRS:
        return "caches and state the test runner reads"
    name = parts[-1]
    if name.endswith((".pyc", ".pyo")):
        return "cached bytecode"
    if name in CONFIG_NAMES:
        return "test configuration"
    if name.endswith(".pth"):
        return "a .pth file (run at interpreter start)"
    for test_path in test_paths:
        if relative == test_path or relative.startswith(test_path.rstrip("/") + "/"):
            return "the task's tests"
    return None


def deciding_test_paths(deciding: Iterable[str], files: frozenset[str]) -> tuple[str, ...]:
    """The test paths the deciding tests' names point at, found among the tree's `files`.

    Each test module's directory (or the module itself, at the tree's root), by matching the
    `classname`'s prefixes to files: `src.isodate.tests.test_duration.DurationTest::test_parseerror` names
    `src/isodate/tests/test_duration.py`, so `src/isodate/tests` is test infrastructure.
    """
    found: list[str] = []
    for name in deciding:
        parts = name.split("::", 1)[0].split(".")
        for end in range(len(parts), 0, -1):
            module = "/".join(parts[:end]) + ".py"
            if module in files:
                directory = module.rpartition("/")[0]
                path = directory or module
                if path not in found:
                    found.append(path)
                break
    return tuple(found)


def shadows(relative: str, packages: frozenset[str]) -> bool:
    """Whether a new file would be importable as a module outside a regular package.

    `packages` are the tree's directories (relative, "" for the root) that hold an `__init__.py`
    in the task's own copy: a new module inside one is only reachable as `package.name`, while one
    anywhere else (the tree's root, a namespace directory pytest puts on `sys.path`) could stand in
    for `json`, `pytest` or a dependency.
    """
    parent, _, name = relative.rpartition("/")
    if not name.endswith(MODULE_SUFFIXES):
        return False
    return parent not in packages


@dataclass(frozen=True)
class Phases:
    """The reports one test got in a run: setup, call and teardown outcomes, and xfail marks."""

    setup: str | None = None
    call: str | None = None
    teardown: str | None = None
    xfail: bool = False

    @property
    def outcome(self) -> str:
        """One word for the test, as pytest's summary counts it."""
        if self.xfail:
            return "xfailed" if self.call != "passed" else "xpassed"
        if "failed" in (self.setup, self.teardown) and self.call != "failed":
            return "error"
        if self.call is not None:
            return self.call
        if self.setup == "skipped":
            return "skipped"
        return "not run"

    @property
    def passed(self) -> bool:
        """Seen to pass: set up, called and torn down cleanly, and not an expected failure."""
        return (self.setup, self.call, self.teardown) == ("passed", "passed", "passed") and not self.xfail


@dataclass
class Stream:
    """What a run's results stream said: each test's phases, collection errors, the end, anomalies."""

    tests: dict[str, Phases] = field(default_factory=dict)  # by JUnit name
    durations: dict[str, float] = field(default_factory=dict)
    collect_errors: list[str] = field(default_factory=list)
    ended: bool = False
    exit_status: int | None = None
    tampered: list[str] = field(default_factory=list)


MAX_TAMPER_NOTES = 20


def read_stream(data: bytes, nonce: str) -> Stream:
    """Parse the runner's JSON lines; anything a forger could add shows up in `tampered`."""
    stream = Stream()
    seen: set[tuple[str, str]] = set()

    def note(what: str) -> None:
        if what not in stream.tampered and len(stream.tampered) < MAX_TAMPER_NOTES:
            stream.tampered.append(what)

    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            note("an unreadable line in the results stream")
            continue
        if not isinstance(line, dict):
            note("an unreadable line in the results stream")
            continue
        if stream.ended:
            note("results after the run's end line")
            continue
        kind = line.get("t")
        if kind == "end":
            stream.ended = True
            if line.get("nonce") != nonce:
                note("an end line without this run's nonce")
            status = line.get("exit")
            stream.exit_status = status if isinstance(status, int) and not isinstance(status, bool) else None
            for what in line.get("tampered") or []:
                note(str(what))
        elif kind == "collect_error":
            stream.collect_errors.append(str(line.get("nodeid")))
        elif kind == "report":
            _add_report(stream, line, seen, note)
        else:
            note("an unreadable line in the results stream")
    return stream


def _add_report(
    stream: Stream, line: dict[str, object], seen: set[tuple[str, str]], note: Callable[[str], None]
) -> None:
    nodeid, name, when, outcome = (line.get(k) for k in ("nodeid", "name", "when", "outcome"))
    if not (
        isinstance(nodeid, str)
        and isinstance(name, str)
        and isinstance(outcome, str)
        and when in ("setup", "call", "teardown")
    ):
        note("an unreadable line in the results stream")
        return
    assert isinstance(when, str)
    if (nodeid, when) in seen:
        note(f"two {when} reports for {nodeid}")
        return
    seen.add((nodeid, when))
    phases = stream.tests.get(name, Phases())
    phases = Phases(
        setup=outcome if when == "setup" else phases.setup,
        call=outcome if when == "call" else phases.call,
        teardown=outcome if when == "teardown" else phases.teardown,
        xfail=phases.xfail or bool(line.get("xfail")),
    )
    stream.tests[name] = phases
    duration = line.get("duration")
    if isinstance(duration, int | float) and not isinstance(duration, bool):
        stream.durations[name] = stream.durations.get(name, 0.0) + float(duration)


@dataclass(frozen=True)
class Decision:
    """The reward a run earns under the named-tests rule, with why, and the deciding tests' states."""

    outcome: str  # passed | failed | timed_out (infra_error is decided with the task's pristine tree)
    reward: float
    reason: str | None
    not_passing: tuple[tuple[str, str], ...]  # (deciding test, what it was)
    harness_suspect: bool  # no verdict at all: the task's harness may be what failed


def decide(
    stream: Stream,
    deciding: Sequence[str],
    *,
    exit_code: int | None,
    signal: int | None,
    timed_out: bool,
    tampered: Sequence[str] = (),
) -> Decision:
    """The named-tests rule over one run (see the module's docstring)."""
    if timed_out:
        return Decision(wire.TIMED_OUT, 0.0, "the tests ran past their timeout and were killed", (), False)
    not_passing = tuple(
        (name, stream.tests[name].outcome if name in stream.tests else "not run")
        for name in deciding
        if name not in stream.tests or not stream.tests[name].passed
    )
    found = [*tampered, *stream.tampered]
    if stream.ended and stream.exit_status is not None and signal is None and exit_code != stream.exit_status:
        found.append(f"the runner exited {exit_code} after pytest finished with {stream.exit_status}")
    if found:
        shown = "; ".join(found[:5]) + (f" (and {len(found) - 5} more)" if len(found) > 5 else "")
        return Decision(wire.FAILED, 0.0, f"tampering with the test run: {shown}", not_passing, False)
    if not stream.ended:
        how = f"signal {signal}" if signal is not None else f"exit {exit_code}"
        return Decision(
            wire.FAILED,
            0.0,
            f"the test run ended before pytest finished ({how}): an early exit, a kill or a crash",
            not_passing,
            True,
        )
    if not_passing:
        shown = ", ".join(f"{name} ({what})" for name, what in not_passing[:3])
        more = f" and {len(not_passing) - 3} more" if len(not_passing) > 3 else ""
        missing = all(what == "not run" for _, what in not_passing)
        return Decision(
            wire.FAILED,
            0.0,
            f"{len(not_passing)} of {len(deciding)} deciding tests did not pass: {shown}{more}",
            not_passing,
            missing,
        )
    return Decision(wire.PASSED, 1.0, None, (), False)


def harness_works(stream: Stream, deciding: Sequence[str]) -> bool:
    """Whether a run on the task's pristine tree gave a verdict: it ended, every deciding test reported."""
    return stream.ended and not stream.tampered and all(name in stream.tests for name in deciding)


def counts(stream: Stream) -> dict[str, int]:
    """Per-test counts as pytest's summary gives them, from the stream."""
    tally = dict.fromkeys(wire.COUNT_KEYS, 0)
    for phases in stream.tests.values():
        outcome = phases.outcome
        if outcome == "xpassed":
            outcome = "passed"
        if outcome in tally:
            tally[outcome] += 1
    return tally
