"""Warm-pool arithmetic: how many sandboxes to start or retire, from counts and a target."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PoolCounts:
    """What a warm pool holds right now."""

    ready: int
    creating: int
    target: int
    max_parallel_creates: int

    def __post_init__(self) -> None:
        """Counts are never negative and at least one create may run at a time."""
        if min(self.ready, self.creating, self.target) < 0:
            raise ValueError("pool counts must not be negative")
        if self.max_parallel_creates < 1:
            raise ValueError("max_parallel_creates must be at least 1")


@dataclass(frozen=True)
class WarmStep:
    """What to do next: start this many creates, retire this many ready sandboxes."""

    create: int
    retire: int


def plan_warm_step(counts: PoolCounts) -> WarmStep:
    """Decide the next step toward `target` ready sandboxes.

    Creates already in flight count toward the target, so a burst of leases never over-provisions;
    surplus ready sandboxes (the target went down) are retired; creates are capped in parallel
    so a refill never turns into a creation storm.
    """
    coming = counts.ready + counts.creating
    if coming < counts.target:
        room = counts.max_parallel_creates - counts.creating
        return WarmStep(create=max(min(counts.target - coming, room), 0), retire=0)
    surplus = counts.ready - max(counts.target - counts.creating, 0)
    return WarmStep(create=0, retire=max(min(surplus, counts.ready), 0))
