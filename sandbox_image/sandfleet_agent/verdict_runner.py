"""Runs a task's pytest suite and streams each test's result to the agent, watching the runner for tampering.

Started by the agent (scoring.py) with the task's own interpreter as
`python3 -P verdict_runner.py RESULTS_FD -- PYTEST_ARGS...`, standard input holding one line: a nonce
that only this run and the agent know. The code under test runs in this process (that is what a
test is), so nothing here can be made unforgeable; what it does is make every cheap way to a pass
visible:

- Results go to a pipe the agent reads (RESULTS_FD), one JSON line per test phase as pytest reports
  it, then an end line carrying the nonce and pytest's exit status. A run that ends early (an
  `os._exit`, a kill, a crash) has no end line; a forged line shows as a duplicate or a line after
  the end; a forged end line needs the nonce, which code under test can only get by reading this
  process's memory (named as residual risk in docs/security.md).
- Once pytest has set itself up and before collection imports the code under test, the runner
  fingerprints pytest's, pluggy's and unittest's machinery (every function and class they define,
  by identity) and the plugins registered; each test's report and the end line say whether
  anything was replaced or added since.

Standard library and the task's own pytest only: this file runs in the task's interpreter, not the
agent's.
"""

from __future__ import annotations

import json
import os
import sys
from types import ModuleType
from typing import Any

import pytest

# The machinery a test's outcome passes through, from the test function's call to its report.
WATCHED_MODULES = (
    "pytest",
    "_pytest.runner",
    "_pytest.python",
    "_pytest.python_api",
    "_pytest.unittest",
    "_pytest.reports",
    "_pytest.skipping",
    "_pytest.outcomes",
    "_pytest.main",
    "_pytest.nodes",
    "_pytest.fixtures",
    "_pytest.config",
    "_pytest.junitxml",
    "_pytest.terminal",
    "_pytest.capture",
    "_pytest.logging",
    "_pytest.assertion",
    "_pytest.assertion.rewrite",
    "_pytest.assertion.util",
    "pluggy",
    "pluggy._callers",
    "pluggy._hooks",
    "pluggy._manager",
    "pluggy._result",
    "unittest",
    "unittest.case",
    "unittest.result",
    "unittest.suite",
    "unittest.loader",
)
# Module globals pytest itself rebinds while tests run (the assertion plugin's per-test hooks).
REBOUND_BY_PYTEST = frozenset(
    {"_pytest.assertion.util._reprcompare", "_pytest.assertion.util._assertion_pass"}
)
MAX_CHANGES_LISTED = 20


def fingerprint(modules: tuple[str, ...] = WATCHED_MODULES) -> dict[str, int]:
    """`name -> id(object)` for what a monkeypatch replaces in the watched modules.

    Every function, class and module they hold, and the functions, properties and descriptors of
    the classes they define.
    """
    seen: dict[str, int] = {}
    for name in modules:
        module = sys.modules.get(name)
        if module is None:
            continue  # not imported yet: fingerprinted from when it is
        seen[f"sys.modules[{name!r}]"] = id(module)
        for attr, value in list(vars(module).items()):
            if not _is_code(value) or f"{name}.{attr}" in REBOUND_BY_PYTEST:
                continue
            seen[f"{name}.{attr}"] = id(value)
            if isinstance(value, type) and _defined_in(value, module):
                for member, inner in list(vars(value).items()):
                    if _is_code(inner):
                        seen[f"{name}.{attr}.{member}"] = id(inner)
    return seen


def _is_code(value: object) -> bool:
    return callable(value) or isinstance(value, (property, staticmethod, classmethod, ModuleType))


def _defined_in(cls: type, module: ModuleType) -> bool:
    return getattr(cls, "__module__", None) == module.__name__


def changed(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """What was replaced or removed since `before` (new names are a module importing more, not tampering)."""
    return sorted(name for name, ident in before.items() if after.get(name) != ident)


def merged(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The baseline from now on: what `before` had, plus names first seen in `after`."""
    return {**after, **before}


class Verdict:
    """The pytest plugin: streams every test report, and checks the machinery before trusting it."""

    def __init__(self, results: int, nonce: str, root: str) -> None:
        self._results = results
        self._nonce = nonce
        self._baseline: dict[str, int] | None = None
        self._root = os.path.realpath(root)
        self._allowed: set[int] = set()
        self._config: Any = None
        self._finished = False
        self.tampered: list[str] = []

    # -- hooks ---------------------------------------------------------------------------------

    def pytest_configure(self, config: Any) -> None:
        self._config = config

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: Any) -> None:
        # pytest and the command line's plugins have set themselves up; no code under test ran yet.
        self._allowed = {id(plugin) for plugin in session.config.pluginmanager.get_plugins()}
        self._baseline = fingerprint()

    def pytest_collection_finish(self, session: Any) -> None:
        self._check("after collection")

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self._send({"t": "collect_error", "nodeid": report.nodeid})

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "call":
            self._check(f"before {report.nodeid}'s report")
        self._send(
            {
                "t": "report",
                "nodeid": report.nodeid,
                "name": junit_name(report.nodeid),
                "when": report.when,
                "outcome": report.outcome,
                "xfail": hasattr(report, "wasxfail"),
                "duration": round(float(getattr(report, "duration", 0.0)), 6),
            }
        )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: Any) -> None:
        # The last test is torn down; pytest's own plugins undo their patches only after this.
        self._check("at the end of the session")
        self._finished = True

    # -- the run's end ---------------------------------------------------------------------------

    def finish(self, exit_status: int) -> None:
        if not self._finished:
            self._tamper("the session never finished")
        if self._config is not None and not self._config.pluginmanager.is_registered(self):
            self._tamper("the verdict plugin was unregistered")
        self._send({"t": "end", "nonce": self._nonce, "exit": exit_status, "tampered": self.tampered})

    def _check(self, when: str) -> None:
        if self._baseline is None or self._config is None:
            self._tamper(f"the run never reached collection ({when})")
            return
        now = fingerprint()
        for name in changed(self._baseline, now)[:MAX_CHANGES_LISTED]:
            self._tamper(f"{name} was replaced ({when})")
        self._baseline = merged(self._baseline, now)
        for plugin in self._config.pluginmanager.get_plugins():
            if id(plugin) not in self._allowed:
                if self._is_task_conftest(plugin):
                    self._allowed.add(id(plugin))
                else:
                    self._tamper(
                        f"a plugin was registered by the code under test: {_describe(plugin)} ({when})"
                    )
                    self._allowed.add(id(plugin))

    def _is_task_conftest(self, plugin: object) -> bool:
        """A conftest.py of the scoring tree (it holds only the task's own, restored from its copy)."""
        path = getattr(plugin, "__file__", None)
        if not isinstance(plugin, ModuleType) or not isinstance(path, str):
            return False
        real = os.path.realpath(path)
        return os.path.basename(real) == "conftest.py" and real.startswith(self._root + os.sep)

    def _tamper(self, what: str) -> None:
        if what not in self.tampered:
            self.tampered.append(what)

    def _send(self, line: dict[str, object]) -> None:
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
        while data:
            data = data[os.write(self._results, data) :]


def junit_name(nodeid: str) -> str:
    """The test's name as pytest's JUnit report gives it (`classname::name`), which tasks list."""
    from _pytest.junitxml import mangle_test_address

    names = mangle_test_address(nodeid)
    classname = ".".join(names[:-1])
    return f"{classname}::{names[-1]}" if classname else names[-1]


def _describe(plugin: object) -> str:
    module = getattr(plugin, "__name__", None) or type(plugin).__module__
    return f"{type(plugin).__name__} from {module}"


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: verdict_runner.py RESULTS_FD -- PYTEST_ARGS...", file=sys.stderr)
        return 2
    results = int(argv[0])
    nonce = sys.stdin.readline().strip()
    # As `python -m pytest` would have it: the working directory first on the path.
    sys.path.insert(0, os.getcwd())
    # Nothing after this line can read the nonce from standard input.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    plugin = Verdict(results, nonce, os.getcwd())
    status = int(pytest.main(argv[2:], plugins=[plugin]))
    plugin.finish(status)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
