"""Which warm sandbox a lease should take: the order, and an index per (pool, image key) that keeps it."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable

from sandfleet.core.model import SandboxPod

# Whether a sandbox is this gateway replica's to hand out first (see core.partition); None: all are.
Mine = Callable[[SandboxPod], bool]


def pick_warm(
    candidates: Iterable[SandboxPod],
    regions: tuple[str, ...],
    skip: frozenset[str] = frozenset(),
    mine: Mine | None = None,
) -> list[SandboxPod]:
    """Warm sandboxes in the order a lease should try them: preferred regions first, then the rest.

    Within a region this replica's own sandboxes go first (so replicas seeing the same warm Pods
    try disjoint ones instead of racing for the same), then the oldest, so warm sandboxes turn over
    instead of aging.
    """
    rank = preference_rank(regions)
    warm = [s for s in candidates if s.warm and s.key not in skip]
    return sorted(warm, key=lambda s: (rank.get(s.region, len(rank)), *_order(s, mine)))


def _order(sandbox: SandboxPod, mine: Mine | None) -> tuple[int, str, float, str]:
    """A sandbox's place within its region: this replica's own first, then by ledger shard, oldest first.

    Shard by shard, so a batch's claims go to as few ledger writes as possible (all shards are ""
    for Pods that carry their own lease).
    """
    return (0 if mine is None or mine(sandbox) else 1, sandbox.shard or "", sandbox.created_at, sandbox.name)


def preference_rank(regions: tuple[str, ...]) -> dict[str, int]:
    """Each preferred region's rank, by its first mention (a repeated region keeps its place)."""
    rank: dict[str, int] = {}
    for region in regions:
        rank.setdefault(region, len(rank))
    return rank


Shelf = tuple[str, str]  # (pool, image key): sandboxes that are interchangeable for a lease
# (theirs, shard, created_at, name, key, token): a heap entry of one region; `theirs` is 0 for this
# replica's own
_Entry = tuple[int, str, float, str, str, int]


class WarmIndex:
    """The warm sandboxes of one shelf, handed out in `pick_warm`'s order without sorting them all.

    One heap per region, ordered this replica's own first, then oldest (name breaks ties).
    Deletion is lazy: a heap entry counts only while its token is the key's current one, and the
    heaps are rebuilt once dead entries outnumber live ones, so every operation costs O(log n)
    amortized (times the number of regions, which is small, when the non-preferred regions are
    merged).
    """

    def __init__(self, mine: Mine | None = None) -> None:
        self._mine = mine
        self._live: dict[str, SandboxPod] = {}
        self._tokens: dict[str, int] = {}  # key -> the token of its one live heap entry
        self._heaps: dict[str, list[_Entry]] = {}  # region -> entries
        self._entries = 0  # live and dead, across the heaps
        self._counter = itertools.count()

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: object) -> bool:
        return key in self._live

    def get(self, key: str) -> SandboxPod | None:
        return self._live.get(key)

    def sandboxes(self) -> list[SandboxPod]:
        """Every sandbox in the index, in no particular order."""
        return list(self._live.values())

    def put(self, sandbox: SandboxPod) -> None:
        """Add or replace the sandbox's entry (by key); one that is not warm leaves the index."""
        if not sandbox.warm:
            self.discard(sandbox.key)
            return
        known = self._live.get(sandbox.key)
        self._live[sandbox.key] = sandbox
        if known is not None and (known.region, known.created_at, known.name) == (
            sandbox.region,
            sandbox.created_at,
            sandbox.name,
        ):
            return  # a new version in the same place: its heap entry still stands for it
        token = next(self._counter)
        self._tokens[sandbox.key] = token
        heapq.heappush(self._heaps.setdefault(sandbox.region, []), self._entry(sandbox, token))
        self._entries += 1
        self._compact_if_mostly_dead()

    def prefer(self, mine: Mine | None) -> None:
        """Hand this replica's own sandboxes out first from now on (the replicas changed)."""
        self._mine = mine
        self._rebuild()

    def _entry(self, sandbox: SandboxPod, token: int) -> _Entry:
        return (*_order(sandbox, self._mine), sandbox.key, token)

    def discard(self, key: str) -> None:
        if self._live.pop(key, None) is not None:
            del self._tokens[key]
            self._compact_if_mostly_dead()

    def clear(self) -> None:
        self._live.clear()
        self._tokens.clear()
        self._heaps.clear()
        self._entries = 0

    def take(
        self,
        count: int,
        regions: tuple[str, ...] = (),
        skip: Callable[[SandboxPod], bool] | None = None,
    ) -> list[SandboxPod]:
        """Remove and return up to `count` sandboxes in lease order (see `pick_warm`).

        Preferred `regions` first, in their order, then every other region merged in the same order.
        Sandboxes for which `skip` is true are passed over and stay in the index.
        """
        rank = preference_rank(regions)
        preferred = list(rank)  # in rank order: dicts keep insertion order
        taken: list[SandboxPod] = []
        passed: list[_Entry] = []
        try:
            for region in preferred:
                while len(taken) < count:
                    entry = self._pop(region)
                    if entry is None:
                        break
                    self._hand_out(entry, skip, taken, passed)
            rest = [region for region in self._heaps if region not in rank]
            while len(taken) < count:
                best: str | None = None
                best_entry: _Entry | None = None
                for region in rest:
                    top = self._peek(region)
                    if top is not None and (best_entry is None or top < best_entry):
                        best, best_entry = region, top
                if best is None:
                    break
                entry = self._pop(best)
                assert entry is not None
                self._hand_out(entry, skip, taken, passed)
        finally:
            for entry in passed:  # still live: back where they were
                heapq.heappush(self._heaps[self._live[entry[4]].region], entry)
                self._entries += 1
        return taken

    def _hand_out(
        self,
        entry: _Entry,
        skip: Callable[[SandboxPod], bool] | None,
        taken: list[SandboxPod],
        passed: list[_Entry],
    ) -> None:
        key = entry[4]
        sandbox = self._live[key]
        if skip is not None and skip(sandbox):
            passed.append(entry)
            return
        del self._live[key]
        del self._tokens[key]
        taken.append(sandbox)

    def _peek(self, region: str) -> _Entry | None:
        """The region's first live entry (dropping dead ones on the way), left in place."""
        heap = self._heaps.get(region)
        while heap:
            top = heap[0]
            if self._tokens.get(top[4]) == top[5]:
                return top
            heapq.heappop(heap)
            self._entries -= 1
        return None

    def _pop(self, region: str) -> _Entry | None:
        top = self._peek(region)
        if top is not None:
            heapq.heappop(self._heaps[region])
            self._entries -= 1
        return top

    def _compact_if_mostly_dead(self) -> None:
        # Lazy deletion leaves dead entries behind (sandboxes claimed by other gateways, deleted, or
        # moved); rebuilding once they outnumber the live ones keeps memory O(n) at O(1) amortized.
        if self._entries > 2 * len(self._live) + 64:
            self._rebuild()

    def _rebuild(self) -> None:
        heaps: dict[str, list[_Entry]] = {}
        for key, sandbox in self._live.items():
            heaps.setdefault(sandbox.region, []).append(self._entry(sandbox, self._tokens[key]))
        for heap in heaps.values():
            heapq.heapify(heap)
        self._heaps = heaps
        self._entries = len(self._live)


class WarmShelves:
    """A WarmIndex per shelf, for a backend to keep current from the changes it sees."""

    def __init__(self) -> None:
        self._shelves: dict[Shelf, WarmIndex] = {}
        self._mine: Mine | None = None

    def shelf(self, pool: str, image_key: str) -> WarmIndex:
        """The live index of one shelf (created empty, so a caller may hold it before any arrive)."""
        index = self._shelves.get((pool, image_key))
        if index is None:
            index = self._shelves[(pool, image_key)] = WarmIndex(self._mine)
        return index

    def prefer(self, mine: Mine | None) -> None:
        """Every shelf hands this replica's own sandboxes out first (see `pick_warm`)."""
        self._mine = mine
        for index in self._shelves.values():
            index.prefer(mine)

    def update(self, sandbox: SandboxPod) -> None:
        """A sandbox was added or changed (its pool and image never change)."""
        if sandbox.warm:
            self.shelf(sandbox.pool, sandbox.image_key).put(sandbox)
        else:
            self.remove(sandbox)

    def remove(self, sandbox: SandboxPod) -> None:
        index = self._shelves.get((sandbox.pool, sandbox.image_key))
        if index is not None:
            index.discard(sandbox.key)

    def clear(self) -> None:
        for index in self._shelves.values():
            index.clear()
