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


def member_shares(serving: Mapping[str, bool]) -> dict[str, float]:
    """Each serving member's share of a pool's warm target: equal, so a lost member's moves to the rest.

    Members that do not serve get none here (nobody can write to them; their own operators keep the
    share they were last given until they are back and told again).
    """
    up = sorted(name for name, serves in serving.items() if serves)
    return {name: round(1.0 / len(up), 6) for name in up}


def share_of(replicas: int, share: float | None) -> int:
    """A member's part of a pool's `replicas` (rounded up, so the members together keep at least all)."""
    if share is None:
        return replicas
    return math.ceil(replicas * share - 1e-9)
