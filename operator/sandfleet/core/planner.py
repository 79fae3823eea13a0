"""The pool planner: from what is observed and the time, which sandboxes to create and which to delete.

Pure: plain data in, a PoolPlan out, the time passed in. The controller applies it and calls again;
every decision is safe to repeat, so a restart or a second look never over-creates or deletes a
leased sandbox.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from sandfleet.core import api
from sandfleet.core.leases import lease_expired
from sandfleet.core.model import PoolSpec, RegionSpec, SandboxPod, Template
from sandfleet.core.placement import RegionCapacity, ideal_split, pick_zones, split_target
from sandfleet.core.recycle import RESERVED_IDLE_SECONDS, RecyclePolicy

# Consecutive sandboxes that never got Ready before the pool is Degraded and replacements back off.
DEGRADED_AFTER_FAILURES = 3
BACKOFF_BASE_SECONDS = 10.0
BACKOFF_MAX_SECONDS = 300.0

# Why a sandbox is deleted (also the Event and metric vocabulary).
RELEASED = "released"
LEASE_EXPIRED = "lease-expired"
NODE_NOT_READY = "node-not-ready"
REGION_REMOVED = "region-removed"
BROKEN = "broken"
NOT_READY_IN_TIME = "not-ready-in-time"
LOST_READINESS = "lost-readiness"
TEMPLATE_CHANGED = "template-changed"
SURPLUS = "surplus"
OVER_MAXIMUM = "over-maximum"
ZONE_GONE = "zone-gone"
# Its ledger entry says the operator retired it (decided to delete it) and the delete has not landed.
RETIRED = "retired"
# A reset sandbox its run did not lease again in time, one past the pool's age bound, or one kept
# for a pool that stopped recycling (see core.recycle).
RESERVED_IDLE = "reserved-idle"
RECYCLE_RETIRED = "recycle-retired"
FAILURE_REASONS = frozenset({BROKEN, NOT_READY_IN_TIME})


@dataclass(frozen=True)
class WarmGroup:
    """Sandboxes of one template to keep warm: the pool's own template first, then pre-warmed images."""

    template: Template
    target: int
    prewarm: bool = False

    @property
    def key(self) -> str:
        return self.template.hash


@dataclass(frozen=True)
class FailureState:
    """The current streak of sandboxes that never got Ready, for backoff and the Degraded condition."""

    template_hash: str = ""
    streak: int = 0
    streak_started_at: float = 0.0
    last_failure_at: float = 0.0
    # The apiserver's words when the last failure was a pass of refused creates; "" when it was a
    # sandbox that broke or never got Ready.
    refusal: str = ""
    # The kubelet's words for the last sandbox that broke ("ErrImagePull: ..."), "" if none said.
    broken_reason: str = ""

    @property
    def degraded(self) -> bool:
        return self.streak >= DEGRADED_AFTER_FAILURES

    def backoff_seconds(self) -> float:
        if not self.degraded:
            return 0.0
        exponent = self.streak - DEGRADED_AFTER_FAILURES
        return min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * float(2 ** min(exponent, 16)))

    def next_attempt_at(self) -> float:
        return self.last_failure_at + self.backoff_seconds()

    def record(self, count: int, now: float, refusal: str = "", broken_reason: str = "") -> FailureState:
        """The streak after `count` more failures at `now`.

        `refusal`: the creates were refused so; `broken_reason`: a sandbox broke so (kept until
        another says otherwise, dropped by a refusal).
        """
        started = self.streak_started_at if self.streak else now
        return replace(
            self,
            streak=self.streak + count,
            streak_started_at=started,
            last_failure_at=now,
            refusal=refusal,
            broken_reason=broken_reason or (self.broken_reason if not refusal else ""),
        )


@dataclass(frozen=True)
class Create:
    """Create one sandbox of the template `template_hash` in `region` (and `zone`, if chosen)."""

    region: str
    zone: str | None
    template_hash: str
    prewarm: bool = False


@dataclass(frozen=True)
class Delete:
    """Delete one sandbox, and why; `force` skips the grace period (its node is gone)."""

    name: str
    reason: str
    force: bool = False


@dataclass(frozen=True)
class RegionStatus:
    """What one region of a pool holds against its target."""

    name: str
    target: int
    ready: int
    leased: int
    starting: int
    failed: int
    capacity: int
    unscheduled: int = 0  # of the starting ones, those with no node yet


@dataclass(frozen=True)
class PoolPlan:
    """What the controller should do now, and what the pool looks like."""

    creates: tuple[Create, ...]
    deletes: tuple[Delete, ...]
    regions: tuple[RegionStatus, ...]
    target: int
    wanted: int
    failures: FailureState
    retry_at: float | None = None
    short_regions: tuple[str, ...] = field(default_factory=tuple)

    @property
    def shortfall(self) -> int:
        return max(0, self.wanted - self.target)

    @property
    def ready(self) -> int:
        return sum(r.ready for r in self.regions)

    @property
    def leased(self) -> int:
        return sum(r.leased for r in self.regions)

    @property
    def starting(self) -> int:
        return sum(r.starting for r in self.regions)

    @property
    def failed(self) -> int:
        return sum(r.failed for r in self.regions)

    @property
    def filled(self) -> bool:
        return all(r.ready >= r.target for r in self.regions)


@dataclass
class _Region:
    """Working counts for one region during planning."""

    leased: int = 0
    failed: int = 0
    ready: dict[str, list[SandboxPod]] = field(default_factory=dict)
    starting: dict[str, list[SandboxPod]] = field(default_factory=dict)
    standins: list[SandboxPod] = field(default_factory=list)
    zones: Counter[str] = field(default_factory=Counter)
    planned: int = 0

    def members(self) -> int:
        return sum(len(v) for v in self.ready.values()) + sum(len(v) for v in self.starting.values())

    def occupied(self) -> int:
        return self.leased + self.members() + len(self.standins) + self.planned


def plan_pool(
    pool: PoolSpec,
    groups: Sequence[WarmGroup],
    sandboxes: Sequence[SandboxPod],
    capacity: Mapping[str, RegionCapacity],
    nodes_ready: Mapping[str, bool],
    failures: FailureState,
    now: float,
) -> PoolPlan:
    """Decide creations and deletions for one pool. `groups[0]` is the pool's own template."""
    specs = {r.name: r for r in pool.regions}
    base = groups[0].key if groups else ""
    rules = _Rules(
        frozenset(g.key for g in groups),
        capacity,
        nodes_ready,
        pool.template.readiness_deadline_seconds,
        now,
        pool.recycle,
    )
    regions = {name: _Region() for name in specs}
    observed = _classify(sandboxes, regions, rules, groups[0].key if groups else None)
    failures = _next_failures(
        failures, base, observed.regions.values(), observed.failed_now, now, observed.broken_reason
    )
    budget, retry_at = _creation_budget(failures, observed.regions.values(), now)
    filled = _fill_groups(pool, groups, observed.regions, capacity, budget)
    shed = _shed_over_maximum(specs, observed.regions)
    return PoolPlan(
        creates=filled.creates,
        deletes=tuple(_unique([*observed.deletes, *filled.deletes, *shed])),
        regions=_region_statuses(specs, observed.regions, filled.targets, capacity),
        target=sum(filled.targets.values()),
        wanted=sum(g.target for g in groups),
        failures=failures,
        retry_at=retry_at,
        short_regions=filled.short,
    )


# -- phase 1: classify what is observed ---------------------------------------------------------


@dataclass(frozen=True)
class _Observed:
    """Each region's working counts, what goes at once and why, and how many failed just now."""

    regions: dict[str, _Region]
    deletes: tuple[Delete, ...]
    failed_now: int
    broken_reason: str = ""  # the kubelet's words for the last of them that broke, if any


@dataclass(frozen=True)
class _Rules:
    """What an observed sandbox is judged by: the templates kept warm, free zones, nodes, the time."""

    active: frozenset[str]
    capacity: Mapping[str, RegionCapacity]
    nodes_ready: Mapping[str, bool]
    deadline: float
    now: float
    recycle: RecyclePolicy | None = None


def _classify(
    sandboxes: Sequence[SandboxPod], regions: dict[str, _Region], rules: _Rules, base: str | None
) -> _Observed:
    """Count each sandbox in its region (`regions`, filled here), or say why it goes now."""
    deletes: list[Delete] = []
    failed_now = 0
    broken_reason = ""
    for sandbox in sorted(sandboxes, key=lambda s: (s.created_at, s.name)):
        if sandbox.terminating:
            continue
        region = regions.get(sandbox.region)
        delete = _classify_one(sandbox, region, rules)
        if delete is None:
            continue
        deletes.append(delete)
        if region is not None and delete.reason in FAILURE_REASONS:
            region.failed += 1
            # Backoff follows the pool's own template; a broken pre-warm image only costs its own slots.
            failed_now += int(sandbox.template_hash == base)
            if sandbox.template_hash == base and sandbox.broken_reason:
                broken_reason = sandbox.broken_reason
    return _Observed(regions, tuple(deletes), failed_now, broken_reason)


def _classify_one(sandbox: SandboxPod, region: _Region | None, rules: _Rules) -> Delete | None:
    """Why `sandbox` goes now, or None once it is counted in `region`."""
    now, deadline = rules.now, rules.deadline
    if sandbox.state == api.LEASE_RELEASED:
        return Delete(sandbox.name, RELEASED)
    if sandbox.state == api.LEASE_RETIRED:
        return Delete(sandbox.name, RETIRED)
    if sandbox.reserved:
        retired = _retire_reserved(sandbox, rules)
        if retired is None and region is not None:
            region.leased += 1  # its run's: counted like a lease, never warm for anyone else
            region.zones[sandbox.zone or ""] += 1
        return retired
    if not sandbox.free:
        # Leased (or a state this operator does not know): never touched until the lease ends.
        if sandbox.leased and lease_expired(sandbox.lease_expires_at, now):
            return Delete(sandbox.name, LEASE_EXPIRED)
        if region is not None:
            region.leased += 1
            region.zones[sandbox.zone or ""] += 1
        return None
    if sandbox.node is not None and rules.nodes_ready.get(sandbox.node) is False:
        return Delete(sandbox.name, NODE_NOT_READY, force=True)
    if region is None:
        return Delete(sandbox.name, REGION_REMOVED)
    zones = rules.capacity.get(sandbox.region, RegionCapacity()).zones
    if sandbox.node is None and sandbox.zone and sandbox.zone not in zones:
        # Pinned to a zone whose last node went away: it can never schedule. Not the image's
        # fault, so no failure is counted; the region's other zones take its place.
        return Delete(sandbox.name, ZONE_GONE)
    lost = sandbox.started and not sandbox.ready and sandbox.unready_since is not None
    if lost and sandbox.unready_since is not None and sandbox.unready_since + deadline <= now:
        # It worked once and stopped (its node, its agent): replace it, but the image is not to blame.
        return Delete(sandbox.name, LOST_READINESS)
    if sandbox.broken or (not sandbox.ready and not lost and sandbox.created_at + deadline <= now):
        return Delete(sandbox.name, BROKEN if sandbox.broken else NOT_READY_IN_TIME)
    if sandbox.template_hash in rules.active:
        bucket = region.ready if sandbox.ready else region.starting
        bucket.setdefault(sandbox.template_hash, []).append(sandbox)
        region.zones[sandbox.zone or ""] += 1
        return None
    if sandbox.ready and not sandbox.prewarm:
        region.standins.append(sandbox)
        return None
    return Delete(sandbox.name, TEMPLATE_CHANGED)


def _retire_reserved(sandbox: SandboxPod, rules: _Rules) -> Delete | None:
    """Why a reserved sandbox goes now (idle too long, too old, recycling off, lost), or None."""
    policy, now = rules.recycle, rules.now
    since = sandbox.reserved_since if sandbox.reserved_since is not None else sandbox.created_at
    if policy is None or now - sandbox.created_at >= policy.max_seconds:
        return Delete(sandbox.name, RECYCLE_RETIRED)
    if now - since > RESERVED_IDLE_SECONDS:
        return Delete(sandbox.name, RESERVED_IDLE)
    if sandbox.broken or not sandbox.ready:
        return Delete(sandbox.name, LOST_READINESS)
    if sandbox.node is not None and rules.nodes_ready.get(sandbox.node) is False:
        return Delete(sandbox.name, NODE_NOT_READY, force=True)
    return None


# -- phase 2: failures and backoff ---------------------------------------------------------------


def _next_failures(
    failures: FailureState,
    base: str,
    regions: Iterable[_Region],
    failed_now: int,
    now: float,
    broken_reason: str = "",
) -> FailureState:
    if failures.template_hash != base:
        failures = FailureState(template_hash=base)
    # A sandbox made during the streak that got Ready proves the template works again.
    recovered = any(
        sandbox.created_at >= failures.streak_started_at
        for region in regions
        for sandbox in region.ready.get(base, ())
    )
    if failures.streak and recovered:
        failures = FailureState(template_hash=base)
    return failures.record(failed_now, now, broken_reason=broken_reason) if failed_now else failures


def _creation_budget(
    failures: FailureState, regions: Iterable[_Region], now: float
) -> tuple[int | None, float | None]:
    """How many sandboxes may be created now (None: no limit), and when to look again if none.

    While Degraded, one probe at a time and only after the backoff: a broken image must not churn.
    """
    if not failures.degraded:
        return None, None
    if now < failures.next_attempt_at():
        return 0, failures.next_attempt_at()
    starting = sum(len(v) for region in regions for v in region.starting.values())
    return 1 - starting, None


# -- phase 3: each group's targets, creations and surplus ----------------------------------------


@dataclass(frozen=True)
class _Fill:
    """What filling every group to its per-region target takes."""

    creates: tuple[Create, ...]
    deletes: tuple[Delete, ...]
    targets: dict[str, int]
    short: tuple[str, ...]


def _fill_groups(
    pool: PoolSpec,
    groups: Sequence[WarmGroup],
    regions: Mapping[str, _Region],
    capacity: Mapping[str, RegionCapacity],
    budget: int | None,
) -> _Fill:
    specs = {r.name: r for r in pool.regions}
    free_slots = {name: dict(capacity.get(name, RegionCapacity()).zones) for name in specs}
    targets = dict.fromkeys(specs, 0)
    short: set[str] = set()
    placed_for: dict[str, dict[str, int]] = {}
    creates: list[Create] = []
    deletes: list[Delete] = []
    for index, group in enumerate(groups):
        is_base = index == 0
        limits = _group_limits(group, specs, regions, free_slots, placed_for)
        floors = None if is_base else dict.fromkeys(specs, 0)
        split = split_target(group.target, pool.regions, limits, floors)
        placed_for[group.key] = split
        for name, value in split.items():
            targets[name] += value
        if is_base:
            ideal = ideal_split(group.target, pool.regions)
            short.update(name for name, value in split.items() if value < ideal.get(name, 0))
        moves, budget = _place_group(group, is_base, split, specs, regions, free_slots, budget)
        creates.extend(moves.creates)
        deletes.extend(moves.deletes)
    return _Fill(tuple(creates), tuple(deletes), targets, tuple(sorted(short)))


def _group_limits(
    group: WarmGroup,
    specs: Mapping[str, RegionSpec],
    regions: Mapping[str, _Region],
    free_slots: Mapping[str, Mapping[str, int]],
    placed_for: Mapping[str, Mapping[str, int]],
) -> dict[str, int]:
    """How many of `group` each region can hold: within its maximum, beside the other groups, in its room."""
    limits = {}
    for name, spec in specs.items():
        region = regions[name]
        have = len(region.ready.get(group.key, ())) + len(region.starting.get(group.key, ()))
        others = region.members() - have
        placed_elsewhere = sum(t.get(name, 0) for t in placed_for.values())
        by_max = spec.max_sandboxes - region.leased - max(others, placed_elsewhere)
        by_capacity = have + sum(max(0, n) for n in free_slots[name].values())
        limits[name] = max(0, min(by_max, by_capacity))
    return limits


@dataclass(frozen=True)
class _Moves:
    """Creations and deletions decided for one group."""

    creates: tuple[Create, ...] = ()
    deletes: tuple[Delete, ...] = ()


def _place_group(
    group: WarmGroup,
    is_base: bool,
    split: Mapping[str, int],
    specs: Mapping[str, RegionSpec],
    regions: Mapping[str, _Region],
    free_slots: Mapping[str, dict[str, int]],
    budget: int | None,
) -> tuple[_Moves, int | None]:
    """Bring each region to its share of `group`; what is left of the creation budget."""
    total_ready = sum(len(r.ready.get(group.key, ())) for r in regions.values())
    ready_allowance = max(0, total_ready - sum(split.values()))
    creates: list[Create] = []
    deletes: list[Delete] = []
    for name in sorted(specs):
        region = regions[name]
        target = split[name]
        ready = region.ready.get(group.key, [])
        starting = region.starting.get(group.key, [])
        if is_base:
            deletes.extend(_retire_standins(region, target, len(ready)))
        have = len(ready) + len(starting)
        if have < target:
            made, freed, budget = _grow(group, specs[name], region, target - have, free_slots[name], budget)
            creates.extend(made)
            deletes.extend(freed)
        elif have > target:
            dropped, ready_allowance = _shrink(group, region, have - target, ready_allowance)
            deletes.extend(dropped)
    return _Moves(tuple(creates), tuple(deletes)), budget


def _retire_standins(region: _Region, target: int, ready: int) -> list[Delete]:
    """Old-template warm sandboxes serve until new ones are Ready, then go."""
    keep = min(len(region.standins), max(0, target - ready))
    retired = [
        Delete(s.name, TEMPLATE_CHANGED)
        for s in _newest_first(region.standins)[: len(region.standins) - keep]
    ]
    region.standins = sorted(region.standins, key=lambda s: (s.created_at, s.name))[:keep]
    return retired


def _grow(
    group: WarmGroup,
    spec: RegionSpec,
    region: _Region,
    want: int,
    zone_slots: dict[str, int],
    budget: int | None,
) -> tuple[list[Create], list[Delete], int | None]:
    """Create up to `want` more in the region's emptiest zones, making room by retiring standing-ins."""
    freed: list[Delete] = []
    room = spec.max_sandboxes - region.occupied()
    if room < want and region.standins:
        count = min(len(region.standins), want - max(0, room))
        freed = [Delete(s.name, TEMPLATE_CHANGED) for s in region.standins[:count]]
        region.standins = region.standins[count:]
        room += count
    count = max(0, min(want, room))
    if budget is not None:
        count = min(count, max(0, budget))
        budget -= count
    zones = pick_zones(count, zone_slots, region.zones)
    for zone in zones:
        zone_slots[zone or ""] = zone_slots.get(zone or "", 0) - 1
        region.zones[zone or ""] += 1
    region.planned += len(zones)
    return [Create(spec.name, zone, group.key, group.prewarm) for zone in zones], freed, budget


def _shrink(
    group: WarmGroup, region: _Region, surplus: int, ready_allowance: int
) -> tuple[list[Delete], int]:
    """Delete `surplus` of the group, starting ones first; what is left of the ready allowance."""
    ready = region.ready.get(group.key, [])
    starting = region.starting.get(group.key, [])
    victims = _newest_first(starting)[:surplus]
    region.starting[group.key] = [s for s in starting if s not in victims]
    surplus -= len(victims)
    # Ready ones go only while the pool stays at its target overall (no dip while shifting).
    removable = min(surplus, ready_allowance)
    ready_victims = _newest_first(ready)[:removable]
    region.ready[group.key] = [s for s in ready if s not in ready_victims]
    return [Delete(s.name, SURPLUS) for s in [*victims, *ready_victims]], ready_allowance - removable


# -- phase 4: shed what a lowered maximum no longer allows ---------------------------------------


def _shed_over_maximum(specs: Mapping[str, RegionSpec], regions: Mapping[str, _Region]) -> list[Delete]:
    """Free sandboxes to delete until each region fits its maximum again, standing-ins first."""
    deletes: list[Delete] = []
    for name, region in regions.items():
        excess = region.occupied() - specs[name].max_sandboxes
        starting_now = [s for members in region.starting.values() for s in members]
        ready_now = [s for members in region.ready.values() for s in members]
        victims = [*region.standins, *_newest_first(starting_now), *_newest_first(ready_now)]
        deletes.extend(Delete(s.name, OVER_MAXIMUM) for s in victims[: max(0, excess)])
    return deletes


# -- phase 5: status ------------------------------------------------------------------------------


def _region_statuses(
    specs: Mapping[str, RegionSpec],
    regions: Mapping[str, _Region],
    targets: Mapping[str, int],
    capacity: Mapping[str, RegionCapacity],
) -> tuple[RegionStatus, ...]:
    return tuple(
        RegionStatus(
            name=name,
            target=targets[name],
            ready=sum(len(v) for v in regions[name].ready.values()) + len(regions[name].standins),
            leased=regions[name].leased,
            starting=sum(len(v) for v in regions[name].starting.values()),
            failed=regions[name].failed,
            capacity=sum(max(0, n) for n in capacity.get(name, RegionCapacity()).zones.values()),
            unscheduled=sum(1 for group in regions[name].starting.values() for s in group if s.node is None),
        )
        for name in specs
    )


def _newest_first(sandboxes: Sequence[SandboxPod]) -> list[SandboxPod]:
    return sorted(sandboxes, key=lambda s: (s.created_at, s.name), reverse=True)


def _unique(deletes: Sequence[Delete]) -> list[Delete]:
    seen: set[str] = set()
    result = []
    for delete in deletes:
        if delete.name not in seen:
            seen.add(delete.name)
            result.append(delete)
    return result
