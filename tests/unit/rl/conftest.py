"""The `torch` marker: tests of the optional torch learner, deselected (and said so) without torch."""

from __future__ import annotations

import importlib.util

import pytest

TORCH = importlib.util.find_spec("torch") is not None
_deselected: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "torch: needs torch (the optional GPU learner path)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without torch, torch tests are deselected, not skipped, and the summary names them.

    Asking for them (`-m torch`) without torch fails them instead: nothing is quietly not run.
    """
    if TORCH or "torch" in (config.getoption("markexpr") or ""):
        return
    keep = [item for item in items if item.get_closest_marker("torch") is None]
    dropped = [item for item in items if item.get_closest_marker("torch") is not None]
    if dropped:
        _deselected.extend(item.nodeid for item in dropped)
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _deselected:
        terminalreporter.write_line(
            f"torch is not installed: {len(_deselected)} torch test(s) deselected "
            f"(install torch and run `pytest -m torch tests/unit/rl` to run them): " + ", ".join(_deselected),
            yellow=True,
        )
