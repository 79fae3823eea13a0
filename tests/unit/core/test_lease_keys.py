"""What a retried acquire must still claim after adopting the leases under its key."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.lease_keys import (
    adoptable,
    asked_otherwise,
    key_owner,
    request_fingerprint,
    still_to_claim,
)
from sandfleet.core.leases import LeaseRecord


def test_a_retry_that_found_its_minimum_claims_nothing_more() -> None:
    assert still_to_claim(250, 150, 150) == (0, 0)
    assert still_to_claim(250, 150, 250) == (0, 0)
    assert still_to_claim(1, 1, 1) == (0, 0)


def test_a_retry_below_its_minimum_claims_the_rest_with_the_minimum_lowered() -> None:
    assert still_to_claim(250, 150, 27) == (223, 123)
    assert still_to_claim(5, 5, 2) == (3, 3)  # a group stays all or nothing
    assert still_to_claim(10, 6, 0) == (10, 6)


@given(st.integers(1, 10_000).flatmap(lambda c: st.tuples(st.just(c), st.integers(1, c), st.integers(0, c))))
def test_found_plus_what_is_claimed_spans_the_request(case: tuple[int, int, int]) -> None:
    count, least, found = case
    rest, rest_least = still_to_claim(count, least, found)
    if found >= least:
        assert (rest, rest_least) == (0, 0)
    else:
        assert found + rest == count
        assert found + rest_least == least
        assert 1 <= rest_least <= rest


def _lease(name: str, attempt: str | None, acquired_at: float) -> LeaseRecord:
    return LeaseRecord(
        name, "pool", "alice", acquired_at, acquired_at + 60, 60, idempotency_key="k", attempt=attempt
    )


def test_an_answered_attempt_is_the_answer_and_late_claims_of_a_dead_one_stay_out() -> None:
    # The dead replica's attempt "a" claimed p0-p4; the retry "b" saw p0-p2, adopted them (now "b")
    # and claimed p5-p7; p3 and p4 reached the Pods after it looked.
    leases = [
        *(_lease(f"p{i}", "b", float(i)) for i in range(3)),
        _lease("p3", "a", 3.0),
        _lease("p4", "a", 4.0),
        *(_lease(f"p{i}", "b", float(i)) for i in range(5, 8)),
    ]
    chosen = adoptable(leases, count=8, least=5)
    assert [lease.id for lease in chosen] == ["p0", "p1", "p2", "p5", "p6", "p7"]


def test_with_no_attempt_at_its_minimum_a_retry_takes_every_claim_up_to_its_count() -> None:
    leases = [_lease("p2", "a", 2.0), _lease("p1", "b", 1.0), _lease("p0", None, 0.0), _lease("p3", "a", 3.0)]
    assert [lease.id for lease in adoptable(leases, count=3, least=5)] == ["p0", "p1", "p2"]


def test_of_two_answered_attempts_the_newest_is_the_answer() -> None:
    leases = [_lease("p0", "a", 0.0), _lease("p1", "a", 1.0), _lease("p2", "b", 5.0), _lease("p3", "b", 6.0)]
    assert [lease.id for lease in adoptable(leases, count=2, least=2)] == ["p2", "p3"]


attempts = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", None]), st.integers(0, 1000)),
    max_size=40,
    unique_by=lambda t: t[1],
)


@given(attempts, st.integers(1, 50).flatmap(lambda c: st.tuples(st.just(c), st.integers(1, c))))
def test_what_a_retry_adopts_is_one_attempt_or_everything_and_never_above_its_count(
    claims: list[tuple[str | None, int]], request: tuple[int, int]
) -> None:
    count, least = request
    leases = [_lease(f"p{at}", attempt, float(at)) for attempt, at in claims]
    chosen = adoptable(leases, count, least)
    assert len(chosen) <= count
    assert len({lease.id for lease in chosen}) == len(chosen)
    by_attempt: dict[str | None, int] = {}
    for lease in leases:
        by_attempt[lease.attempt] = by_attempt.get(lease.attempt, 0) + 1
    if any(n >= least for n in by_attempt.values()):
        assert len({lease.attempt for lease in chosen}) == 1
        assert by_attempt[chosen[0].attempt] >= least
    else:
        assert len(chosen) == min(count, len(leases))


BODY: dict[str, object] = {
    "pool": "python",
    "image": None,
    "count": 8,
    "least": 4,
    "ttl_seconds": 600,
    "labels": {"run": "r1", "episode": "3"},
    "regions": ["us-east1"],
    "policy_version": 7,
}
OTHER_VALUES: dict[str, object] = {
    "pool": "python2",
    "image": "task:1",
    "count": 9,
    "least": 8,
    "ttl_seconds": None,
    "labels": {"run": "r2", "episode": "3"},
    "regions": ["us-east1", "europe-west4"],
    "policy_version": None,
}


def test_the_same_request_has_the_same_fingerprint_whatever_the_order_of_its_labels() -> None:
    reordered = {**BODY, "labels": {"episode": "3", "run": "r1"}}
    assert request_fingerprint(**BODY) == request_fingerprint(**reordered)  # type: ignore[arg-type]


@given(field=st.sampled_from(sorted(BODY)))
def test_any_field_asked_otherwise_is_another_request(field: str) -> None:
    other = {**BODY, field: OTHER_VALUES[field]}
    assert request_fingerprint(**BODY) != request_fingerprint(**other)  # type: ignore[arg-type]


def test_leases_of_older_gateways_say_nothing_of_what_was_asked() -> None:
    asked = request_fingerprint(**BODY)  # type: ignore[arg-type]
    mine = LeaseRecord("ns.a", "python", "actor", 1.0, 61.0, 60, idempotency_key="k", request=asked)
    older = LeaseRecord("ns.b", "python", "actor", 1.0, 61.0, 60, idempotency_key="k")
    other = LeaseRecord("ns.c", "python", "actor", 1.0, 61.0, 60, idempotency_key="k", request="0" * 16)
    assert not asked_otherwise([mine, older], asked)
    assert asked_otherwise([mine, older, other], asked)


key_names = st.text(alphabet="ab/:-", min_size=0, max_size=6)


@given(key_names, key_names, key_names, key_names)
def test_distinct_holder_and_key_pairs_never_share_a_slot(h1: str, k1: str, h2: str, k2: str) -> None:
    assert (key_owner(h1, k1) == key_owner(h2, k2)) == ((h1, k1) == (h2, k2))
