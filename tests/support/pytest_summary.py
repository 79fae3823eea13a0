"""Pytest's own verdict on a run, read from its terminal summary line, to check evaluate's counts against."""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-9;]*m")
SUMMARY = re.compile(r"^=+ (?P<body>.+?) in [0-9.]+s(?: \([^)]*\))? =+$")
# pytest's words, and the evaluate count each one lands in (a non-strict XPASS is a pass in JUnit).
WORDS = {
    "passed": "passed",
    "xpassed": "passed",
    "failed": "failed",
    "error": "error",
    "errors": "error",
    "skipped": "skipped",
    "xfailed": "xfailed",
}

# A test module whose every outcome pytest counts differently from a naive reading of its output.
MIXED_TESTS = """
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("setup fails")

@pytest.fixture
def bad_teardown():
    yield 1
    raise RuntimeError("teardown fails")

def test_pass():
    print("PASSED test_fake.py::test_printed_only")

def test_fail():
    assert 1 == 2

def test_setup_error(broken):
    pass

def test_teardown_error(bad_teardown):
    pass

def test_fail_and_teardown_error(bad_teardown):
    assert False

@pytest.mark.skip(reason="not here")
def test_skip():
    pass

@pytest.mark.parametrize("n", [1, 2, 3])
def test_skipped_alike(n):
    pytest.skip("one reason for all three")

@pytest.mark.xfail(reason="known")
def test_xfail():
    assert False

@pytest.mark.xfail(reason="known")
def test_xpass():
    pass

@pytest.mark.xfail(reason="known", strict=True)
def test_xpass_strict():
    pass

@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_odd(n):
    assert n % 2

def test_subtests(subtests):
    for i in range(4):
        with subtests.test(i=i):
            assert i < 2

def test_subtests_pass(subtests):
    for i in range(2):
        with subtests.test(i=i):
            pass
"""


def summary_counts(output: str) -> dict[str, int]:
    """The counts of pytest's last summary line (`== 8 failed, 5 passed, 1 xpassed in 0.1s ==`)."""
    lines = [ANSI.sub("", line).strip() for line in output.splitlines()]
    body = next(match["body"] for line in reversed(lines) if (match := SUMMARY.match(line)))
    counts = dict.fromkeys(("passed", "failed", "error", "skipped", "xfailed"), 0)
    for part in body.split(", "):
        number, word = part.split(" ", 1)
        if word in WORDS:
            counts[WORDS[word]] += int(number)
    return counts
