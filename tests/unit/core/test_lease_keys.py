"""What a retried acquire must still claim after adopting the leases under its key."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.lease_keys import still_to_claim


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
