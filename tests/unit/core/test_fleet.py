"""A fleet member's health as the gateway sees it, and how a count splits over the members."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.fleet import MemberHealth, member_shares, observe, share_of, split_count, withdraw

LOST_AFTER = 3.0


def test_a_short_blip_costs_nothing() -> None:
    health = observe(MemberHealth(), connected=False, now=10.0, lost_after=LOST_AFTER)
    assert health == MemberHealth(down_since=10.0)
    assert health.shelved
    health = observe(health, connected=False, now=12.9, lost_after=LOST_AFTER)
    assert not health.lost
    assert health.down_since == 10.0
    assert observe(health, connected=True, now=13.0, lost_after=LOST_AFTER) == MemberHealth()


def test_down_long_enough_is_lost_and_back_as_soon_as_it_connects() -> None:
    health = observe(MemberHealth(), connected=False, now=10.0, lost_after=LOST_AFTER)
    health = observe(health, connected=False, now=13.0, lost_after=LOST_AFTER)
    assert health.lost
    assert not health.shelved
    assert observe(health, connected=False, now=99.0, lost_after=LOST_AFTER).lost  # stays lost
    back = observe(health, connected=True, now=100.0, lost_after=LOST_AFTER)
    assert back == MemberHealth()
    assert back.shelved


def test_a_failed_write_withdraws_it_until_it_has_stayed_connected_a_while() -> None:
    health = withdraw(MemberHealth(), now=10.0)
    assert not health.shelved
    assert not health.lost
    assert not observe(health, connected=True, now=12.0, lost_after=LOST_AFTER).shelved
    assert observe(health, connected=True, now=13.0, lost_after=LOST_AFTER) == MemberHealth()


def test_a_withdrawn_member_that_goes_down_is_lost() -> None:
    health = withdraw(MemberHealth(), now=10.0)
    health = observe(health, connected=False, now=10.5, lost_after=LOST_AFTER)
    health = observe(health, connected=False, now=13.5, lost_after=LOST_AFTER)
    assert health.lost
    assert health.withdrawn_since is None
    back = observe(health, connected=True, now=20.0, lost_after=LOST_AFTER)
    assert back == MemberHealth()  # its relist restores its sandboxes


def test_withdrawing_a_lost_member_keeps_it_lost() -> None:
    lost = MemberHealth(down_since=1.0, lost=True)
    assert withdraw(lost, now=5.0).lost


@given(
    st.lists(st.tuples(st.booleans(), st.floats(min_value=0, max_value=2)), max_size=40),
)
def test_lost_means_down_lost_after_seconds_on_end(looks: list[tuple[bool, float]]) -> None:
    health, now = MemberHealth(), 0.0
    down_since: float | None = None
    for connected, step in looks:
        now += step
        health = observe(health, connected, now, LOST_AFTER)
        if connected:
            down_since = None
            assert not health.lost
        else:
            down_since = down_since if down_since is not None else now
            assert health.lost == (now - down_since >= LOST_AFTER)
        assert health.down_since == down_since


@given(st.integers(min_value=0, max_value=10_000), st.integers(min_value=1, max_value=64))
def test_a_count_splits_whole_and_even(count: int, members: int) -> None:
    shares = split_count(count, members)
    assert len(shares) == members
    assert sum(shares) == count
    assert max(shares) - min(shares) <= 1
    assert shares == sorted(shares, reverse=True)


def test_a_count_needs_a_member() -> None:
    with pytest.raises(ValueError, match="one member or more"):
        split_count(3, 0)


def test_serving_members_share_a_pools_warm_target_equally() -> None:
    assert member_shares({"m0": True, "m1": True, "m2": True}) == {
        "m0": 0.333333,
        "m1": 0.333333,
        "m2": 0.333333,
    }
    assert member_shares({"m0": True, "m1": False}) == {"m0": 1.0}  # a lost member's share moves
    assert member_shares({"m0": False}) == {}


@given(st.integers(min_value=0, max_value=10_000), st.integers(min_value=1, max_value=9))
def test_the_members_shares_keep_at_least_the_whole_target(replicas: int, members: int) -> None:
    shares = member_shares({f"m{i}": True for i in range(members)})
    kept = [share_of(replicas, share) for share in shares.values()]
    assert sum(kept) >= replicas
    assert sum(kept) <= replicas + members  # rounding up costs at most one each
    assert share_of(replicas, None) == replicas
