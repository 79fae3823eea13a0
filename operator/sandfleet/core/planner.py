"""The pool planner: from what is observed and the time, which sandboxes to create and which to delete.

Pure: plain data in, a Plan out, the time passed in. The controller applies the Plan and calls again;
every decision is safe to repeat, so a restart or a second look never over-creates or deletes a
leased sandbox.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from sandfleet.core import api
from sandfleet.core.model import PoolSpec, Sandbox, Template
from sandfleet.core.placement import RegionCapacity, pick_zones, split_target

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

    def record(self, count: int, now: float) -> FailureState:
        """The streak after `count` more sandboxes failed at `now`."""
        started = self.streak_started_at if self.streak else now
        return replace(self, streak=self.streak + count, streak_started_at=started, last_failure_at=now)


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


@dataclass(frozen=True)
class Plan:
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
    ready: dict[str, list[Sandbox]] = field(default_factory=dict)
    starting: dict[str, list[Sandbox]] = field(default_factory=dict)
    standins: list[Sandbox] = field(default_factory=list)
    zones: Counter[str] = field(default_factory=Counter)
    planned: int = 0

    def members(self) -> int:
        return sum(len(v) for v in self.ready.values()) + sum(len(v) for v in self.starting.values())

    def occupied(self) -> int:
        return self.leased + self.members() + len(self.standins) + self.planned


def plan(
    pool: PoolSpec,
    groups: Sequence[WarmGroup],
    sandboxes: Sequence[Sandbox],
    capacity: Mapping[str, RegionCapacity],
    nodes_ready: Mapping[str, bool],
    failures: FailureState,
    now: float,
) -> Plan:
    """Decide creations and deletions for one pool. `groups[0]` is the pool's own template."""
    region_specs = {r.name: r for r in pool.regions}
    active = {g.key: g for g in groups}
    deadline = pool.template.readiness_deadline_seconds
    deletes: list[Delete] = []
    regions = {name: _Region() for name in region_specs}
    failed_now = 0

    for sandbox in sorted(sandboxes, key=lambda s: (s.created_at, s.name)):
        if sandbox.deleting:
            continue
        region = regions.get(sandbox.region)
        if sandbox.lease_state == api.LEASE_RELEASED:
            deletes.append(Delete(sandbox.name, RELEASED))
            continue
        if not sandbox.free:
            # Leased (or a state this operator does not know): never touched until the lease ends.
            if sandbox.leased and sandbox.lease_expires_at is not None and sandbox.lease_expires_at <= now:
                deletes.append(Delete(sandbox.name, LEASE_EXPIRED))
            elif region is not None:
                region.leased += 1
                region.zones[sandbox.zone or ""] += 1
            continue
        if sandbox.node is not None and nodes_ready.get(sandbox.node) is False:
            deletes.append(Delete(sandbox.name, NODE_NOT_READY, force=True))
            continue
        if region is None:
            deletes.append(Delete(sandbox.name, REGION_REMOVED))
            continue
        if (
            sandbox.node is None
            and sandbox.zone
            and sandbox.zone not in capacity.get(sandbox.region, RegionCapacity()).zones
        ):
            # Pinned to a zone whose last node went away: it can never schedule. Not the image's
            # fault, so no failure is counted; the region's other zones take its place.
            deletes.append(Delete(sandbox.name, ZONE_GONE))
            continue
        in_group = sandbox.template_hash in active
        lost = sandbox.started and not sandbox.ready and sandbox.unready_since is not None
        if lost and sandbox.unready_since is not None and sandbox.unready_since + deadline <= now:
            # It worked once and stopped (its node, its agent): replace it, but the image is not to blame.
            deletes.append(Delete(sandbox.name, LOST_READINESS))
            continue
        if sandbox.broken or (not sandbox.ready and not lost and sandbox.created_at + deadline <= now):
            deletes.append(Delete(sandbox.name, BROKEN if sandbox.broken else NOT_READY_IN_TIME))
            region.failed += 1
            # Backoff follows the pool's own template; a broken pre-warm image only costs its own slots.
            failed_now += int(bool(groups) and sandbox.template_hash == groups[0].key)
            continue
        if in_group:
            bucket = region.ready if sandbox.ready else region.starting
            bucket.setdefault(sandbox.template_hash, []).append(sandbox)
            region.zones[sandbox.zone or ""] += 1
        elif sandbox.ready and not sandbox.prewarm:
            region.standins.append(sandbox)
        else:
            deletes.append(Delete(sandbox.name, TEMPLATE_CHANGED))

    failures = _next_failures(failures, groups[0].key if groups else "", regions.values(), failed_now, now)
    # While Degraded, one probe at a time and only after the backoff: a broken image must not churn.
    creation_budget: int | None = None
    retry_at = None
    if failures.degraded:
        starting = sum(len(v) for r in regions.values() for v in r.starting.values())
        creation_budget = 1 - starting if now >= failures.next_attempt_at() else 0
        if now < failures.next_attempt_at():
            retry_at = failures.next_attempt_at()

    creates: list[Create] = []
    free_slots = {name: dict(capacity.get(name, RegionCapacity()).zones) for name in region_specs}
    targets: dict[str, int] = dict.fromkeys(region_specs, 0)
    wanted = 0
    short: set[str] = set()
    placed_for: dict[str, dict[str, int]] = {}
    for index, group in enumerate(groups):
        is_base = index == 0
        wanted += group.target
        limits = {}
        for name, spec in region_specs.items():
            region = regions[name]
            have = len(region.ready.get(group.key, ())) + len(region.starting.get(group.key, ()))
            others = region.members() - have
            placed_elsewhere = sum(t.get(name, 0) for t in placed_for.values())
            by_max = spec.max_sandboxes - region.leased - max(others, placed_elsewhere)
            by_capacity = have + sum(max(0, n) for n in free_slots[name].values())
            limits[name] = max(0, min(by_max, by_capacity))
        floors = None if is_base else dict.fromkeys(region_specs, 0)
        split = split_target(group.target, pool.regions, limits, floors)
        placed_for[group.key] = split
        for name, value in split.items():
            targets[name] += value
            ideal = _ideal_share(group.target, pool, name) if is_base else 0
            if value < ideal:
                short.add(name)
        total_ready = sum(len(r.ready.get(group.key, ())) for r in regions.values())
        ready_allowance = max(0, total_ready - sum(split.values()))
        for name in sorted(region_specs):
            region = regions[name]
            made, ready_allowance, creation_budget = _reconcile_group_in_region(
                group,
                is_base,
                name,
                region,
                split[name],
                free_slots[name],
                ready_allowance,
                creation_budget,
                region_specs[name].max_sandboxes,
                deletes,
            )
            creates.extend(made)

    # A lowered maximum: shed free sandboxes until the region fits again, standing-ins first.
    for name, region in regions.items():
        excess = region.occupied() - region_specs[name].max_sandboxes
        starting_now = [s for members in region.starting.values() for s in members]
        ready_now = [s for members in region.ready.values() for s in members]
        victims = [*region.standins, *_newest_first(starting_now), *_newest_first(ready_now)]
        for sandbox in victims[: max(0, excess)]:
            deletes.append(Delete(sandbox.name, OVER_MAXIMUM))

    statuses = tuple(
        RegionStatus(
            name=name,
            target=targets[name],
            ready=sum(len(v) for v in regions[name].ready.values()) + len(regions[name].standins),
            leased=regions[name].leased,
            starting=sum(len(v) for v in regions[name].starting.values()),
            failed=regions[name].failed,
            capacity=sum(max(0, n) for n in capacity.get(name, RegionCapacity()).zones.values()),
        )
        for name in region_specs
    )
    return Plan(
        creates=tuple(creates),
        deletes=tuple(_unique(deletes)),
        regions=statuses,
        target=sum(targets.values()),
        wanted=wanted,
        failures=failures,
        retry_at=retry_at,
        short_regions=tuple(sorted(short)),
    )


def _reconcile_group_in_region(
    group: WarmGroup,
    is_base: bool,
    name: str,
    region: _Region,
    target: int,
    zone_slots: dict[str, int],
    ready_allowance: int,
    creation_budget: int | None,
    maximum: int,
    deletes: list[Delete],
) -> tuple[list[Create], int, int | None]:
    ready = region.ready.get(group.key, [])
    starting = region.starting.get(group.key, [])
    creates: list[Create] = []
    if is_base:
        # Old-template warm sandboxes serve until new ones are Ready, then go.
        keep = min(len(region.standins), max(0, target - len(ready)))
        for sandbox in _newest_first(region.standins)[: len(region.standins) - keep]:
            deletes.append(Delete(sandbox.name, TEMPLATE_CHANGED))
        region.standins = sorted(region.standins, key=lambda s: (s.created_at, s.name))[:keep]
    have = len(ready) + len(starting)
    if have < target:
        want = target - have
        room = maximum - region.occupied()
        if room < want and region.standins:
            freed = min(len(region.standins), want - max(0, room))
            for sandbox in region.standins[:freed]:
                deletes.append(Delete(sandbox.name, TEMPLATE_CHANGED))
            region.standins = region.standins[freed:]
            room += freed
        count = max(0, min(want, room))
        if creation_budget is not None:
            count = min(count, max(0, creation_budget))
            creation_budget -= count
        zones = pick_zones(count, zone_slots, region.zones)
        for zone in zones:
            creates.append(Create(name, zone, group.key, group.prewarm))
            zone_slots[zone or ""] = zone_slots.get(zone or "", 0) - 1
            region.zones[zone or ""] += 1
        region.planned += len(zones)
    elif have > target:
        surplus = have - target
        victims = _newest_first(starting)[:surplus]
        for sandbox in victims:
            deletes.append(Delete(sandbox.name, SURPLUS))
        region.starting[group.key] = [s for s in starting if s not in victims]
        surplus -= len(victims)
        # Ready ones go only while the pool stays at its target overall (no dip while shifting).
        removable = min(surplus, ready_allowance)
        ready_victims = _newest_first(ready)[:removable]
        for sandbox in ready_victims:
            deletes.append(Delete(sandbox.name, SURPLUS))
        region.ready[group.key] = [s for s in ready if s not in ready_victims]
        ready_allowance -= removable
    return creates, ready_allowance, creation_budget


def _ideal_share(total: int, pool: PoolSpec, region: str) -> int:
    weights = sum(r.weight for r in pool.regions)
    for spec in pool.regions:
        if spec.name == region:
            share = total * spec.weight // weights if weights else 0
            return min(spec.max_sandboxes, max(spec.min_warm, share))
    return 0


def _next_failures(
    failures: FailureState, base: str, regions: Iterable[_Region], failed_now: int, now: float
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
    return failures.record(failed_now, now) if failed_now else failures


def _newest_first(sandboxes: Sequence[Sandbox]) -> list[Sandbox]:
    return sorted(sandboxes, key=lambda s: (s.created_at, s.name), reverse=True)


def _unique(deletes: Sequence[Delete]) -> list[Delete]:
    seen: set[str] = set()
    result = []
    for delete in deletes:
        if delete.name not in seen:
            seen.add(delete.name)
            result.append(delete)
    return result
