"""A fleet member's health as the gateway sees it, and how a count splits over the members."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.fleet import (
    MemberHealth,
    MemberOffer,
    member_shares,
    observe,
    share_of,
    split_count,
    withdraw,
)

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


def test_members_of_equal_weight_and_no_known_limit_share_equally() -> None:
    three = {name: MemberOffer() for name in ("m0", "m1", "m2")}
    assert member_shares(30, three) == {"m0": 0.333333334, "m1": 0.333333334, "m2": 0.333333334}
    assert member_shares(30, {"m0": MemberOffer()}) == {"m0": 1.0}  # a lost member's share moves
    assert member_shares(30, {}) == {}


def test_shares_follow_the_weights() -> None:
    offers = {"big": MemberOffer(weight=3), "small": MemberOffer()}
    assert member_shares(40, offers) == {"big": 0.75, "small": 0.25}
    assert member_shares(0, offers) == {"big": 0.75, "small": 0.25}


def test_a_member_short_of_room_keeps_what_fits_and_the_rest_moves_to_the_others() -> None:
    offers = {"m0": MemberOffer(), "m1": MemberOffer(room=2), "m2": MemberOffer(weight=3)}
    shares = member_shares(30, offers)
    assert [share_of(30, shares[m]) for m in ("m0", "m1", "m2")] == [7, 2, 21]


def test_when_every_member_is_full_the_rest_is_split_by_weight_anyway() -> None:
    offers = {"m0": MemberOffer(room=4), "m1": MemberOffer(room=2)}
    shares = member_shares(12, offers)
    assert [share_of(12, shares[m]) for m in ("m0", "m1")] == [7, 5]


def test_a_weight_must_be_positive() -> None:
    with pytest.raises(ValueError, match="above 0"):
        member_shares(3, {"m0": MemberOffer(weight=0)})


offer = st.builds(
    MemberOffer,
    weight=st.sampled_from([0.5, 1.0, 2.0, 3.0, 10.0]),
    room=st.none() | st.integers(min_value=0, max_value=20_000),
)


@given(st.integers(min_value=0, max_value=100_000), st.lists(offer, min_size=1, max_size=9))
def test_the_members_shares_keep_at_least_the_whole_target(replicas: int, offers: list[MemberOffer]) -> None:
    shares = member_shares(replicas, {f"m{i}": o for i, o in enumerate(offers)})
    kept = {name: share_of(replicas, share) for name, share in shares.items()}
    assert sum(kept.values()) >= replicas
    assert sum(kept.values()) <= replicas + len(offers)  # rounding up costs at most one each
    room = sum(o.room if o.room is not None else replicas for o in offers)
    if room >= replicas:  # where the whole target fits, nobody is given more than its room
        for index, o in enumerate(offers):
            if o.room is not None:
                assert kept[f"m{index}"] <= o.room
    assert share_of(replicas, None) == replicas
