"""Recycling decisions: reset or destroy after an episode, warm or destroy after the probe, and the probe."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.recycle import (
    RESERVED_IDLE_SECONDS,
    TCP_LISTEN,
    Fingerprint,
    RecyclePolicy,
    fingerprint_from_json,
    probe_problems,
    recycle_decision,
    reserved_to_drop,
)

POLICY = RecyclePolicy(max_episodes=4, max_seconds=600)
AGENT_PORT = 8000

policies = st.builds(
    RecyclePolicy, max_episodes=st.integers(2, 50), max_seconds=st.floats(1, 1e5, allow_nan=False)
)
runs = st.one_of(st.none(), st.just(""), st.text(min_size=1, max_size=12))
problems = st.one_of(st.none(), st.lists(st.text(min_size=1, max_size=20), max_size=3))


def test_a_run_s_young_sandbox_is_reset_then_warmed_when_its_probe_is_clean() -> None:
    before = recycle_decision(POLICY, run="r1", episodes=1, born_at=100, now=110)
    after = recycle_decision(POLICY, run="r1", episodes=1, born_at=100, now=111, probe=[])
    assert before.recycle
    assert after.recycle


@pytest.mark.parametrize(
    ("policy", "run", "episodes", "now", "probe", "reason"),
    [
        (None, "r1", 1, 110, None, "does not recycle"),
        (POLICY, None, 1, 110, None, "no run label"),
        (POLICY, "", 1, 110, None, "no run label"),
        (POLICY, "r1", 4, 110, None, "served 4 episodes"),
        (POLICY, "r1", 1, 700, None, "past the pool's 600 s"),
        (POLICY, "r1", 1, 110, ["/workspace differs"], "/workspace differs"),
    ],
)
def test_everything_else_is_destroyed_and_says_why(
    policy: RecyclePolicy | None,
    run: str | None,
    episodes: int,
    now: float,
    probe: list[str] | None,
    reason: str,
) -> None:
    decision = recycle_decision(policy, run=run, episodes=episodes, born_at=100, now=now, probe=probe)
    assert not decision.recycle
    assert reason in decision.reason


@given(policies, runs, st.integers(0, 100), st.floats(0, 1e6), st.floats(0, 1e6), problems)
def test_recycled_only_within_every_bound(
    policy: RecyclePolicy,
    run: str | None,
    episodes: int,
    born_at: float,
    now: float,
    probe: list[str] | None,
) -> None:
    decision = recycle_decision(policy, run=run, episodes=episodes, born_at=born_at, now=now, probe=probe)
    within = bool(run) and episodes < policy.max_episodes and now - born_at < policy.max_seconds and not probe
    assert decision.recycle == within
    assert decision.reason
    # Without a policy nothing is ever recycled, whatever else holds.
    assert not recycle_decision(
        None, run=run, episodes=episodes, born_at=born_at, now=now, probe=probe
    ).recycle


@given(policies, st.integers(0, 60), st.floats(0, 1e4))
def test_a_sandbox_serves_at_most_max_episodes(policy: RecyclePolicy, start: int, born_at: float) -> None:
    # Episode after episode of one run, each ending instantly: the K-th is never recycled.
    served = start
    while recycle_decision(policy, run="r", episodes=served, born_at=born_at, now=born_at).recycle:
        served += 1
    assert served == max(start, policy.max_episodes)


def test_policies_are_validated() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        RecyclePolicy(max_episodes=1, max_seconds=10)
    with pytest.raises(ValueError, match="positive"):
        RecyclePolicy(max_episodes=2, max_seconds=0)


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=5), st.tuples(st.floats(0, 1e4), st.floats(0, 1e4)), max_size=8
    ),
    policies,
    st.floats(0, 2e4),
)
def test_reserved_sandboxes_are_dropped_when_too_old_or_idle(
    reserved: dict[str, tuple[float, float]], policy: RecyclePolicy, now: float
) -> None:
    dropped = set(reserved_to_drop(reserved, policy, now))
    for key, (born_at, since) in reserved.items():
        stale = now - born_at >= policy.max_seconds or now - since > RESERVED_IDLE_SECONDS
        assert (key in dropped) == stale


GOLDEN = Fingerprint(
    processes=frozenset({(1, 0, "/usr/bin/python3 -m sandfleet_agent --port 8000")}),
    sockets=frozenset({("tcp", AGENT_PORT, 0, TCP_LISTEN), ("tcp", AGENT_PORT, 51000, "01")}),
    files={"/workspace": "a" * 64, "/tmp": "b" * 64, "/tests": "absent"},
)


def test_a_reset_that_matches_the_golden_sandbox_is_clean() -> None:
    # The agent's callers (the probe's own connection) use other client ports every time.
    seen = Fingerprint(
        processes=GOLDEN.processes,
        sockets=frozenset({("tcp", AGENT_PORT, 0, TCP_LISTEN), ("tcp", AGENT_PORT, 43210, "01")}),
        files=dict(GOLDEN.files),
    )
    assert probe_problems(GOLDEN, seen, AGENT_PORT) == []


@pytest.mark.parametrize(
    ("change", "found"),
    [
        ({"processes": GOLDEN.processes | {(77, 1000, "sleep 1000")}}, "77 'sleep 1000'"),
        ({"processes": frozenset()}, "golden processes missing"),
        ({"sockets": GOLDEN.sockets | {("tcp", 9000, 0, TCP_LISTEN)}}, "sockets differ"),
        ({"sockets": GOLDEN.sockets | {("udp", 5353, 0, "")}}, "sockets differ"),
        ({"sockets": GOLDEN.sockets | {("tcp", 40000, 443, "01")}}, "sockets differ"),
        ({"sockets": GOLDEN.sockets | {("unix:/tmp/s", 0, 0, "")}}, "sockets differ"),
        ({"files": {**GOLDEN.files, "/workspace": "c" * 64}}, "/workspace differs"),
        ({"files": {**GOLDEN.files, "/tests": "d" * 64}}, "/tests differs"),
        ({"files": {"/workspace": "a" * 64}}, "/tmp differs"),
    ],
)
def test_anything_the_episode_left_is_a_problem(change: dict[str, object], found: str) -> None:
    seen = Fingerprint(**{**GOLDEN.__dict__, **change})
    assert any(found in problem for problem in probe_problems(GOLDEN, seen, AGENT_PORT))


def test_the_agent_s_answer_is_read_and_malformed_answers_are_refused() -> None:
    answer = {
        "processes": [{"pid": 1, "uid": 0, "cmdline": "agent"}],
        "sockets": [{"proto": "tcp", "local_port": 8000, "remote_port": 0, "state": "0A"}],
        "files": {"/workspace": "ab"},
    }
    read = fingerprint_from_json(answer)
    assert read == Fingerprint(
        frozenset({(1, 0, "agent")}), frozenset({("tcp", 8000, 0, "0A")}), {"/workspace": "ab"}
    )
    malformed: list[object] = [
        [],
        {"processes": []},
        {**answer, "processes": [{"pid": "x"}]},
        {**answer, "files": []},
    ]
    for bad in malformed:
        with pytest.raises(ValueError, match="probe answer"):
            fingerprint_from_json(bad)
