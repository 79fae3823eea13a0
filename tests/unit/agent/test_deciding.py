"""The named-tests rule as data: what is test infrastructure, what a results stream says, what it earns."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet_agent.deciding import (
    Phases,
    Stream,
    counts,
    decide,
    deciding_test_paths,
    harness_works,
    infrastructure,
    read_stream,
    shadows,
)

NONCE = "a" * 32
NAMES = ["t.test_a::test_one", "t.test_a::test_two"]


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("conftest.py", "test configuration"),
        ("src/pkg/conftest.py", "test configuration"),
        ("pytest.ini", "test configuration"),
        ("pyproject.toml", "test configuration"),
        ("setup.cfg", "test configuration"),
        ("tox.ini", "test configuration"),
        ("sitecustomize.py", "test configuration"),
        ("usercustomize.py", "test configuration"),
        ("evil.pth", "a .pth file (run at interpreter start)"),
        ("pkg/__pycache__/mod.cpython-311.pyc", "caches and state the test runner reads"),
        ("mod.pyc", "cached bytecode"),
        (".pytest_cache/v/cache/lastfailed", "caches and state the test runner reads"),
        ("tests/test_a.py", "the task's tests"),
        ("tests/data/x.json", "the task's tests"),
        ("pkg/mod.py", None),
        ("testsuite.py", None),  # only the path itself or below it
        ("README.md", None),
    ],
)
def test_infrastructure_is_named_wherever_it_is(path: str, why: str | None) -> None:
    assert infrastructure(path, ["tests"]) == why


def test_new_modules_shadow_only_outside_regular_packages() -> None:
    packages = frozenset({"pkg", "pkg/sub"})
    assert shadows("json.py", packages)  # the tree's root is on sys.path
    assert shadows("pytest/__init__.py", packages)
    assert shadows("src/six.py", packages)  # a namespace directory pytest may put on sys.path
    assert shadows("fast.cpython-311-x86_64-linux-gnu.so", packages)
    assert not shadows("pkg/helpers.py", packages)
    assert not shadows("pkg/sub/more.py", packages)
    assert not shadows("notes.txt", packages)


def test_deciding_names_point_at_their_modules_directories() -> None:
    files = frozenset({"src/isodate/tests/test_duration.py", "test_root.py", "tests/test_b.py"})
    deciding = [
        "src.isodate.tests.test_duration.DurationTest::test_parseerror",
        "src.isodate.tests.test_duration::test_suite",
        "test_root::test_x",
        "tests.test_b.B.Inner::test_y",
        "nowhere.test_c::test_z",
    ]
    assert deciding_test_paths(deciding, files) == ("src/isodate/tests", "test_root.py", "tests")


def line(**fields: object) -> bytes:
    return json.dumps(fields).encode() + b"\n"


def report(name: str, when: str, outcome: str = "passed", xfail: bool = False) -> bytes:
    return line(t="report", nodeid=name, name=name, when=when, outcome=outcome, xfail=xfail, duration=0.1)


def passing(name: str) -> bytes:
    return b"".join(report(name, when) for when in ("setup", "call", "teardown"))


END = line(t="end", nonce=NONCE, exit=0, tampered=[])


def test_every_deciding_test_seen_passing_earns_1() -> None:
    stream = read_stream(b"".join(passing(n) for n in NAMES) + END, NONCE)
    decision = decide(stream, NAMES, exit_code=0, signal=None, timed_out=False)
    assert (decision.outcome, decision.reward, decision.not_passing) == ("passed", 1.0, ())


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (passing(NAMES[0]) + END, "1 of 2 deciding tests did not pass: t.test_a::test_two (not run)"),
        (passing(NAMES[0]) + report(NAMES[1], "setup", "skipped") + END, "(skipped)"),
        (
            passing(NAMES[0])
            + report(NAMES[1], "setup")
            + report(NAMES[1], "call", "skipped", xfail=True)
            + END,
            "(xfailed)",
        ),
        (
            passing(NAMES[0])
            + report(NAMES[1], "setup")
            + report(NAMES[1], "call", xfail=True)
            + report(NAMES[1], "teardown")
            + END,
            "(xpassed)",
        ),
        (
            passing(NAMES[0])
            + report(NAMES[1], "setup")
            + report(NAMES[1], "call")
            + report(NAMES[1], "teardown", "failed")
            + END,
            "(error)",
        ),
    ],
)
def test_a_deciding_test_not_seen_passing_earns_0(data: bytes, why: str) -> None:
    decision = decide(read_stream(data, NONCE), NAMES, exit_code=0, signal=None, timed_out=False)
    assert (decision.outcome, decision.reward) == ("failed", 0.0)
    assert decision.reason is not None
    assert why in decision.reason


@pytest.mark.parametrize(
    ("data", "found"),
    [
        (
            b"".join(passing(n) for n in NAMES) + line(t="end", nonce="b" * 32, exit=0),
            "without this run's nonce",
        ),
        (b"".join(passing(n) for n in NAMES) + END + passing(NAMES[0]), "results after the run's end line"),
        (passing(NAMES[0]) + passing(NAMES[0]) + passing(NAMES[1]) + END, "two setup reports"),
        (b"".join(passing(n) for n in NAMES) + b"{not json\n" + END, "an unreadable line"),
        (
            b"".join(passing(n) for n in NAMES)
            + line(t="end", nonce=NONCE, exit=0, tampered=["x was replaced"]),
            "x was replaced",
        ),
    ],
)
def test_a_forged_or_tampered_stream_earns_0_and_says_so(data: bytes, found: str) -> None:
    stream = read_stream(data, NONCE)
    decision = decide(stream, NAMES, exit_code=0, signal=None, timed_out=False)
    assert (decision.outcome, decision.reward) == ("failed", 0.0)
    assert decision.reason is not None
    assert found in decision.reason
    assert not decision.harness_suspect


def test_a_run_that_never_ends_is_failed_and_suspects_the_harness() -> None:
    stream = read_stream(b"".join(passing(n) for n in NAMES), NONCE)  # os._exit(0) before the end
    decision = decide(stream, NAMES, exit_code=0, signal=None, timed_out=False)
    assert (decision.outcome, decision.reward, decision.harness_suspect) == ("failed", 0.0, True)
    assert not harness_works(stream, NAMES)
    killed = decide(stream, NAMES, exit_code=137, signal=9, timed_out=False)
    assert killed.reason is not None
    assert "signal 9" in killed.reason


def test_an_exit_status_other_than_pytests_is_tampering() -> None:
    stream = read_stream(b"".join(passing(n) for n in NAMES) + END, NONCE)
    decision = decide(stream, NAMES, exit_code=3, signal=None, timed_out=False)
    assert decision.reason is not None
    assert "exited 3 after pytest finished with 0" in decision.reason


def test_a_timeout_earns_0_whatever_the_stream_said() -> None:
    stream = read_stream(b"".join(passing(n) for n in NAMES) + END, NONCE)
    decision = decide(stream, NAMES, exit_code=137, signal=9, timed_out=True)
    assert (decision.outcome, decision.reward) == ("timed_out", 0.0)


@given(st.binary(max_size=400))
def test_any_bytes_parse_without_raising_and_never_earn_without_the_nonce(data: bytes) -> None:
    stream = read_stream(data, NONCE)
    decision = decide(stream, NAMES, exit_code=0, signal=None, timed_out=False)
    assert decision.reward == 0.0


def test_counts_follow_pytests_summary() -> None:
    stream = Stream(
        tests={
            "a": Phases("passed", "passed", "passed"),
            "b": Phases("passed", "failed", "passed"),
            "c": Phases("failed"),
            "d": Phases("skipped"),
            "e": Phases("passed", "skipped", "passed", xfail=True),
        }
    )
    assert counts(stream) == {"passed": 1, "failed": 1, "error": 1, "skipped": 1, "xfailed": 1}
