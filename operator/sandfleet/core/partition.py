"""Which gateway replica a warm sandbox belongs to first: rendezvous hashing over the live replicas."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence


def weight(member: str, name: str) -> int:
    """The member's score for a sandbox name; the highest score owns it (stable, uniform, no table)."""
    digest = hashlib.blake2b(f"{member}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(name: str, members: Iterable[str]) -> str | None:
    """The member a sandbox belongs to first, None when there are no members.

    Every replica that sees the same members computes the same owner, so their first choices are
    disjoint; a member joining takes about 1/n of the names from the others and a member leaving
    hands only its own names on, so a change of membership reorders few sandboxes.
    """
    best: tuple[int, str] | None = None
    for member in members:
        score = (weight(member, name), member)
        if best is None or score > best:
            best = score
    return best[1] if best is not None else None


def shard_owner(shard: str, members: Sequence[str]) -> str | None:
    """The member a ledger shard belongs to first: shards dealt round the sorted members.

    Shards are few (core.ledger.DEFAULT_SHARDS), so hashing them would leave one replica with
    twice another's share; dealt in turn, the shares differ by one shard at most. A change of
    membership moves many shards, which costs nothing here: ownership is a preference that keeps
    replicas writing different ledgers, never a lock.
    """
    ordered = sorted(members)
    if not ordered:
        return None
    index = int(shard) if shard.isdigit() else weight("", shard)
    return ordered[index % len(ordered)]


def live_members(last_seen: dict[str, float], me: str, now: float, lease_seconds: float) -> tuple[str, ...]:
    """The replicas to share warm sandboxes with: ourselves, and every other renewed within a lease.

    `last_seen` is when each replica's Lease last changed by our own clock (not its renewTime, so
    clock skew between replicas cannot keep a dead one in or push a live one out).
    """
    alive = {member for member, seen in last_seen.items() if now - seen < lease_seconds}
    return tuple(sorted(alive | {me}))
