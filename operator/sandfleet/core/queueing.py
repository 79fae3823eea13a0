"""The lease wait queue's policy: who is admitted, their position and ETA, and when to say 429."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Admission:
    """Whether a caller may wait for a sandbox, and what to tell them."""

    admitted: bool
    position: int  # 1-based place in the pool's queue once admitted
    eta_seconds: float
    retry_after_seconds: int  # for a 429: when trying again is likely to be admitted


def admit(waiting: int, max_waiting: int, eta_per_place: float) -> Admission:
    """Admit a caller behind `waiting` others unless the queue is full."""
    position = waiting + 1
    eta = position * eta_per_place
    if waiting >= max_waiting:
        # Told to come back when the queue has drained enough to take them.
        return Admission(False, position, eta, max(1, math.ceil(eta - max_waiting * eta_per_place)))
    return Admission(True, position, eta, 0)


@dataclass
class RateEstimator:
    """An exponentially weighted event rate (events/s) with a half-life, fed with times passed in."""

    half_life_seconds: float = 10.0
    rate: float = 0.0
    last_event: float | None = None

    def observe(self, now: float, events: int = 1) -> None:
        if self.last_event is None:
            self.last_event = now
            return
        elapsed = max(now - self.last_event, 1e-3)
        decay = 0.5 ** (elapsed / self.half_life_seconds)
        self.rate = self.rate * decay + (1 - decay) * (events / elapsed)
        self.last_event = now

    def current(self, now: float) -> float:
        """The rate as of `now`: it decays while no events arrive."""
        if self.last_event is None:
            return 0.0
        idle = max(now - self.last_event, 0.0)
        return float(self.rate * 0.5 ** (idle / self.half_life_seconds))


def eta_per_place(refill_rate: float, spinup_seconds: float) -> float:
    """Seconds each place in the queue is worth: the refill rate if known, else one spin-up."""
    if refill_rate > 1e-6:
        return 1.0 / refill_rate
    return spinup_seconds


def boot_overlap(arrived: float, granted: float, created: float, ready: float | None) -> float:
    """The part of a wait over [arrived, granted] spent on a sandbox booting over [created, ready].

    Zero for a sandbox already warm on arrival, or whose creation or ready time is unknown.
    """
    if ready is None or created <= 0:
        return 0.0
    return max(0.0, min(granted, ready) - max(arrived, created))


def serve_order(
    waiters: Iterable[tuple[int, float]], warm: int, overtake_seconds: float
) -> list[tuple[int, int]]:
    """`serve_plan` for a queue of whole requests only (each `(missing, waited_seconds)`)."""
    return serve_plan(((missing, waited, False) for missing, waited in waiters), warm, overtake_seconds)


def serve_plan(
    waiters: Iterable[tuple[int, float, bool]], warm: int, overtake_seconds: float
) -> list[tuple[int, int]]:
    """Which waiters get how many of `warm` sandboxes now.

    `waiters` are in arrival order, each `(missing, waited_seconds, batch)`: a whole request (a
    single lease or an all-or-nothing group) or a batch (takes any number up to `missing`).

    The rule, bounding head-of-line blocking without starving groups:
    - waiters are served in arrival order, each one whole, while warm sandboxes last;
    - a whole request that cannot be served whole yet is passed over (those behind it may
      overtake it) while it has waited less than `overtake_seconds`;
    - once it has waited that long it is not overtaken again: it takes what is warm now (a partial
      claim it keeps) and everything that becomes warm after, until it is whole;
    - a batch that cannot be served whole takes what is left once the requests behind it that
      have waited `overtake_seconds` are served by these same rules; its younger followers get
      nothing meanwhile. The first such batch is the only one that takes part of what is warm.

    So a request behind a blocked group waits at most `overtake_seconds` plus the time the group
    needs to fill, a group is never overtaken for more than `overtake_seconds`, and a batch soaks
    up every refill without making anyone behind it wait longer than `overtake_seconds` (a batch
    is bounded by its own wait instead). With `overtake_seconds` 0 this is strict FIFO. Returns
    `(index, take)` pairs; `take` < `missing` only for the last pair: a group collecting its
    sandboxes, or a batch taking the rest.

    Waiters are read lazily and no further than needed: behind a batch that takes the rest, the
    first waiter younger than `overtake_seconds` ends the walk (in arrival order, all behind it
    are younger still).
    """
    turns: list[tuple[int, int]] = []
    batch: tuple[int, int] | None = None  # the first batch that could not be served whole
    for index, (missing, waited, divisible) in enumerate(waiters):
        if warm <= 0:
            break
        if batch is not None and waited < overtake_seconds:
            break  # only followers that have waited the bound go before the batch
        if missing <= warm:
            turns.append((index, missing))
            warm -= missing
        elif divisible:
            batch = batch or (index, missing)
        elif waited >= overtake_seconds:
            turns.append((index, warm))
            return turns  # an old group collects all that is warm, before any batch
    if batch is not None and warm > 0:
        turns.append((batch[0], min(batch[1], warm)))
    return turns
