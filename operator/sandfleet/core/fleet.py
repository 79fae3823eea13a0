"""When a fleet's member cluster counts as lost, withdrawn or back, and how a count splits over members."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class MemberHealth:
    """What the fleet gateway knows of one member cluster's reachability."""

    down_since: float | None = None  # when its watches were first seen down (None: up)
    lost: bool = False
    # When a write to it failed: its warm sandboxes are off the shelves for a while, so acquires
    # take the other members' instead of failing on it again (None: not withdrawn).
    withdrawn_since: float | None = None

    @property
    def shelved(self) -> bool:
        """Whether its warm sandboxes may be handed out."""
        return not self.lost and self.withdrawn_since is None


def observe(health: MemberHealth, connected: bool, now: float, lost_after: float) -> MemberHealth:
    """Its health after one look: lost once down `lost_after` seconds on end, back as soon as it connects.

    A short blip (a watch reconnecting) costs nothing; a member down longer is lost, so acquires stop
    waiting on it and its holders hear at once that their leases went with it. A withdrawn member
    that stays connected gets its warm sandboxes back after `lost_after` seconds.
    """
    withdrawn = health.withdrawn_since
    if withdrawn is not None and now - withdrawn >= lost_after:
        withdrawn = None
    if connected:
        return MemberHealth(withdrawn_since=None if health.lost else withdrawn)
    down_since = health.down_since if health.down_since is not None else now
    return MemberHealth(down_since, health.lost or now - down_since >= lost_after, withdrawn)


def withdraw(health: MemberHealth, now: float) -> MemberHealth:
    """Its health once a write to it failed: withdrawn from now (a lost member stays lost)."""
    return replace(health, withdrawn_since=now)


def split_count(count: int, members: int) -> list[int]:
    """`count` over `members` as evenly as whole numbers go, the larger shares first (sums to `count`)."""
    if members < 1:
        raise ValueError("a count splits over one member or more")
    each, extra = divmod(count, members)
    return [each + (index < extra) for index in range(members)]


@dataclass(frozen=True)
class MemberOffer:
    """What one serving member can take of a pool: its weight, and room for that many sandboxes now."""

    weight: float = 1.0
    # The most warm sandboxes of the pool it can hold now (those on its nodes plus what its nodes
    # still fit, as its operator last wrote in the pool's status); None while unknown: no limit.
    room: int | None = None


def member_shares(replicas: int, offers: Mapping[str, MemberOffer]) -> dict[str, float]:
    """Each serving member's share of a pool's `replicas`: by weight, each held to its room.

    What a member has no room for moves to the others by weight (water-filling), so a member short
    of nodes, like a lost one, gives its part up. When every member is full, what is left is split by
    weight anyway: each then reports itself capacity-limited, which is the truth. With no replicas,
    shares follow the weights alone. Members that do not serve are not in `offers`: nobody can write
    to them, and their own operators keep the share they were last given until told again.
    """
    if not offers:
        return {}
    if any(offer.weight <= 0 for offer in offers.values()):
        raise ValueError("a member's weight must be above 0")
    if replicas <= 0:
        total = sum(offer.weight for offer in offers.values())
        return {name: _up(offer.weight / total) for name, offer in sorted(offers.items())}
    allotted: dict[str, float] = {}
    open_ = sorted(offers)
    left = float(replicas)
    while open_:
        total = sum(offers[name].weight for name in open_)
        full = [
            name
            for name in open_
            if (room := offers[name].room) is not None and room < left * offers[name].weight / total
        ]
        if not full:
            allotted.update({name: left * offers[name].weight / total for name in open_})
            break
        for name in full:
            allotted[name] = float(offers[name].room or 0)
            left -= allotted[name]
            open_.remove(name)
    else:
        total = sum(offer.weight for offer in offers.values())
        for name, offer in offers.items():
            allotted[name] += left * offer.weight / total
    return {name: _up(allotted[name] / replicas) for name in sorted(offers)}


def _up(share: float) -> float:
    """`share` rounded up in the ninth digit.

    So ceil(replicas x share) never keeps one too few, nor (below a million replicas) one more than
    the member's room.
    """
    return math.ceil(share * 1e9 - 1e-6) / 1e9


def share_of(replicas: int, share: float | None) -> int:
    """A member's part of a pool's `replicas` (rounded up, so the members together keep at least all)."""
    if share is None:
        return replicas
    # The share was rounded up by under replicas x 1e-9 (a thousandth of a sandbox below a million
    # replicas): that is no sandbox more.
    return math.ceil(replicas * share - 1e-3)
