"""Rendezvous ownership of warm sandboxes among gateway replicas, and which replicas count as live."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.partition import live_members, owner

member_names = st.lists(st.text("abcdefgh-", min_size=1, max_size=6), min_size=1, max_size=6, unique=True)
sandbox_names = st.lists(st.text("abcdefghij0123456789-", min_size=1, max_size=12), max_size=50, unique=True)


def test_no_members_owns_nothing() -> None:
    assert owner("python-abc", ()) is None


@given(member_names, sandbox_names)
def test_every_replica_computes_the_same_owner_whatever_order_it_lists_them(
    members: list[str], names: list[str]
) -> None:
    for name in names:
        assert owner(name, members) == owner(name, list(reversed(members))) in members


@given(member_names, st.text("xyz", min_size=1, max_size=4), sandbox_names)
def test_a_replica_joining_takes_names_only_for_itself(
    members: list[str], new: str, names: list[str]
) -> None:
    """Adding a member moves a name only to the newcomer; removing it moves only its own names back."""
    grown = [*members, new] if new not in members else members
    for name in names:
        before, after = owner(name, members), owner(name, grown)
        assert after in (before, new)


def test_shares_are_about_even() -> None:
    members = [f"gw-{i}" for i in range(4)]
    counts = Counter(owner(f"python-{i:05}", members) for i in range(4000))
    assert set(counts) == set(members)
    assert all(800 <= n <= 1200 for n in counts.values()), counts


def test_live_members_are_those_renewed_within_a_lease_and_always_ourselves() -> None:
    seen = {"gw-a": 100.0, "gw-b": 90.0, "gw-c": 84.9}
    assert live_members(seen, "gw-me", now=100.0, lease_seconds=15.0) == ("gw-a", "gw-b", "gw-me")
    assert live_members({}, "gw-me", now=0.0, lease_seconds=15.0) == ("gw-me",)
    assert live_members({"gw-me": 0.0}, "gw-me", now=99.0, lease_seconds=15.0) == ("gw-me",)
