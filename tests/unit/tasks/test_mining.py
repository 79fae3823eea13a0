"""The factory's decisions: which mutants to try and keep, what tests they break, which files are code."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from sandfleet.tasks.mining import (
    SuiteRun,
    candidates_for,
    choose,
    judge,
    read_junit,
    runtime_wheels,
    source_files,
)
from sandfleet.tasks.mutations import Mutant, mutants

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
  <testcase classname="tests.test_a" name="test_ok" time="0.1"/>
  <testcase classname="tests.test_a" name="test_bad"><failure message="x">boom</failure></testcase>
  <testcase classname="tests.test_a" name="test_err"><error message="y"/></testcase>
  <testcase classname="tests.test_a" name="test_skip"><skipped message="z"/></testcase>
  <testcase name="bare"/>
</testsuite></testsuites>
"""
MUTANT = Mutant("compare_negate", 3, 3, "Lt -> GtE", "x = 1\n")


def test_junit_outcomes_are_read_per_test() -> None:
    assert read_junit(JUNIT) == {
        "tests.test_a::test_ok": "passed",
        "tests.test_a::test_bad": "failed",
        "tests.test_a::test_err": "error",
        "tests.test_a::test_skip": "skipped",
        "bare": "passed",
    }


def test_a_mutant_is_kept_only_when_tests_the_clean_tree_passes_fail() -> None:
    passing = {"t::a", "t::b"}
    kept = judge(MUTANT, "m.py", SuiteRun({"t::a": "failed", "t::b": "passed"}, 1, 0.1), passing)
    assert kept.kept
    assert kept.fail_to_pass == ("t::a",)
    survived = judge(MUTANT, "m.py", SuiteRun({"t::a": "passed", "t::b": "passed"}, 0, 0.1), passing)
    assert not survived.kept
    assert survived.reason == "survived"
    timed_out = judge(MUTANT, "m.py", SuiteRun({}, None, 9.0), passing)
    assert not timed_out.kept
    assert timed_out.reason == "timed out"
    # A test the clean tree does not pass failing proves nothing about the mutant.
    other = judge(
        MUTANT, "m.py", SuiteRun({"t::a": "passed", "t::b": "passed", "t::c": "failed"}, 1, 0.1), passing
    )
    assert not other.kept


def test_a_crash_before_any_report_breaks_every_test() -> None:
    verdict = judge(MUTANT, "m.py", SuiteRun({}, 2, 0.1), {"t::a", "t::b"})
    assert verdict.kept
    assert verdict.fail_to_pass == ("t::a", "t::b")


@settings(max_examples=60, deadline=None)
@given(limit=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_choose_spreads_over_lines_is_seeded_and_never_repeats(limit: int, seed: int) -> None:
    source = "def f(a, b):\n    if a < b and a > 0:\n        return a + 1\n    return max(a, b) - 2\n"
    pool = [(f"m{i}.py", m) for i in range(2) for m in mutants(source)]
    chosen = choose(pool, limit, seed)
    assert chosen == choose(pool, limit, seed)
    assert len(chosen) == min(limit, len(pool))
    assert len({(f, m.source) for f, m in chosen}) == len(chosen)
    lines = {(f, m.line) for f, m in pool}
    if limit >= len(lines):
        assert {(f, m.line) for f, m in chosen} == lines  # every line before any line twice


def test_candidates_hold_the_original_and_the_bug() -> None:
    source = "def f(a, b):\n    return a < b\n"
    found = [m for m in mutants(source) if m.line == 2]
    verdict = judge(found[0], "f.py", SuiteRun({"t::a": "failed"}, 1, 0.1), {"t::a"})
    options = candidates_for(source, verdict, found[1:], seed=1)
    assert "    return a < b\n" in options
    assert len(set(options)) == len(options) >= 2


def test_source_files_skip_tests_docs_and_build_scripts(tmp_path: Path) -> None:
    for name in ["pkg/__init__.py", "pkg/core.py", "tests/test_core.py", "pkg/test_x.py", "setup.py",
                 "conftest.py", "docs/conf.py", "single.py"]:  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    found = [p.relative_to(tmp_path).as_posix() for p in source_files(tmp_path)]
    assert found == ["pkg/__init__.py", "pkg/core.py", "single.py"]


def test_pinned_dependencies_are_found_offline_under_any_spelling(tmp_path: Path) -> None:
    # What an earlier resolve left: the pins next to the sdist, the wheels as PyPI names them.
    (tmp_path / "typing-extensions-4.12.2.requires.txt").write_text("zope.interface==7.2\nsix==1.17.0\n")
    for wheel in ("six-1.17.0-py2.py3-none-any.whl", "zope_interface-7.2-cp311-cp311-linux_x86_64.whl"):
        (tmp_path / wheel).write_bytes(b"")
    found = runtime_wheels("typing-extensions==4.12.2", tmp_path)
    assert [w.name for w in found] == [
        "zope_interface-7.2-cp311-cp311-linux_x86_64.whl",
        "six-1.17.0-py2.py3-none-any.whl",
    ]
