"""Where sandboxes can go: free capacity per region and zone, and a pool's target split over regions."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from sandfleet.core.model import Node, RegionSpec, Taint, Template
from sandfleet.core.resources import Resources

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True)
class RegionCapacity:
    """How many more sandboxes of one template the region's usable nodes can take, per zone."""

    zones: Mapping[str, int] = field(default_factory=dict)
    ready_nodes: int = 0
    nodes: int = 0

    @property
    def free(self) -> int:
        return sum(self.zones.values())


def tolerates(tolerations: Iterable[Mapping[str, object]], taint: Taint) -> bool:
    """Whether a Pod with `tolerations` may be scheduled onto a node with `taint`."""
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.effect:
            continue
        key = toleration.get("key") or ""
        if toleration.get("operator", "Equal") == "Exists":
            if not key or key == taint.key:
                return True
        elif key == taint.key and (toleration.get("value") or "") == taint.value:
            return True
    return False


def node_accepts(node: Node, template: Template) -> bool:
    """Whether new sandboxes of `template` may land on `node` (ready, schedulable, selected, tolerated)."""
    if not (node.ready and node.schedulable):
        return False
    if any(node.labels.get(k) != v for k, v in template.node_selector.items()):
        return False
    blocking = (taint for taint in node.taints if taint.effect in BLOCKING_EFFECTS)
    return all(tolerates(template.tolerations, taint) for taint in blocking)


def region_capacity(
    nodes: Iterable[Node],
    requested: Mapping[str, Resources],
    template: Template,
    regions: Sequence[RegionSpec],
    unscheduled: Mapping[str, int] | None = None,
) -> dict[str, RegionCapacity]:
    """Free sandbox slots per region and zone: allocatable minus what every Pod on the node requests.

    `unscheduled` counts this pool's Pods per region that wait for the scheduler: they will take
    slots that look free now, so they come off the region's capacity.
    """
    wanted = {r.name: r for r in regions}
    request = template.requests
    zones: dict[str, dict[str, int]] = {r: {} for r in wanted}
    ready: dict[str, int] = dict.fromkeys(wanted, 0)
    total: dict[str, int] = dict.fromkeys(wanted, 0)
    for node in nodes:
        spec = wanted.get(node.region or "")
        if spec is None or (spec.zones and node.zone not in spec.zones):
            continue
        total[spec.name] += 1
        if node.ready:
            ready[spec.name] += 1
        if not node_accepts(node, template):
            continue
        free = node.allocatable - requested.get(node.name, Resources())
        zone = node.zone or ""
        zones[spec.name][zone] = zones[spec.name].get(zone, 0) + free.fits(request)
    result = {}
    for name, per_zone in zones.items():
        waiting = (unscheduled or {}).get(name, 0)
        # Take the waiting Pods off the zones with most room first, as the scheduler would place them.
        adjusted = dict(per_zone)
        for _ in range(waiting):
            if not adjusted or max(adjusted.values()) <= 0:
                break
            fullest = max(sorted(adjusted), key=lambda z: adjusted[z])
            adjusted[fullest] -= 1
        result[name] = RegionCapacity(zones=adjusted, ready_nodes=ready[name], nodes=total[name])
    return result


def share_at(weight: Fraction, level: Fraction, floor: int, limit: int) -> Fraction:
    """A region's share at water level `level`: weight x level, within [floor, limit], the limit winning."""
    return min(max(weight * level, Fraction(floor)), Fraction(limit))


def ideal_split(total: int, regions: Sequence[RegionSpec]) -> dict[str, int]:
    """Each region's share of `total` by weight alone, within [minWarm, maxSandboxes], room ignored.

    What a region would hold if every region had room; a region placed below it is short.
    """
    weights = sum(r.weight for r in regions)
    level = Fraction(total, weights) if weights else Fraction(0)
    shares: dict[str, int] = {}
    for spec in regions:
        share = share_at(Fraction(spec.weight), level, spec.min_warm, spec.max_sandboxes)
        shares.setdefault(spec.name, math.floor(share))
    return shares


def split_target(
    total: int,
    regions: Sequence[RegionSpec],
    limits: Mapping[str, int],
    floors: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Split `total` over regions by weight, each within [floor, limit].

    What a region cannot take moves to the others by weight. Floors (minWarm unless given, capped
    by the limit) win over the total.
    """
    limit = {r.name: max(0, limits.get(r.name, 0)) for r in regions}
    floor = {r.name: min(limit[r.name], (floors or {}).get(r.name, r.min_warm)) for r in regions}
    weight = {r.name: Fraction(max(r.weight, 0)) for r in regions}

    def placed(level: Fraction) -> dict[str, Fraction]:
        return {n: share_at(weight[n], level, floor[n], limit[n]) for n in limit}

    # The total placed grows with the level, piecewise linearly; it bends only where a region hits
    # its floor or its limit. Find the segment where it reaches the total and solve exactly there,
    # so floors and limits are honoured together (fixing one kind first can overshoot the total).
    bends = sorted(
        {Fraction(0)} | {Fraction(b) / weight[n] for n in limit if weight[n] for b in (floor[n], limit[n])}
    )
    target = min(Fraction(total), Fraction(sum(limit.values())))
    exact = placed(bends[-1])
    low = bends[0]
    for high in bends:
        reached = sum(placed(high).values(), Fraction(0))
        if reached >= target:
            at_low = sum(placed(low).values(), Fraction(0))
            if reached == at_low:
                exact = placed(high)
            else:
                exact = placed(low + (high - low) * (target - at_low) / (reached - at_low))
            break
        low = high
    result = {name: int(value) for name, value in exact.items()}
    leftover = max(0, min(total, sum(limit.values())) - sum(result.values()))
    # Largest remainder first; names break ties so every replica of the operator agrees.
    order = sorted(exact, key=lambda n: (-(exact[n] - result[n]), n))
    for name in order:
        if leftover <= 0:
            break
        if exact[name] > result[name] and result[name] < limit[name]:
            result[name] += 1
            leftover -= 1
    return result


def pick_zones(count: int, free: Mapping[str, int], current: Mapping[str, int]) -> list[str | None]:
    """Zones for `count` new sandboxes: each goes where the pool has fewest, among zones with room."""
    room = {z: n for z, n in free.items() if n > 0}
    placed = {z: current.get(z, 0) for z in room}
    zones: list[str | None] = []
    for _ in range(count):
        if not room:
            break
        zone = min(sorted(room), key=lambda z: placed[z])
        zones.append(zone or None)
        placed[zone] += 1
        room[zone] -= 1
        if room[zone] <= 0:
            del room[zone]
    return zones
