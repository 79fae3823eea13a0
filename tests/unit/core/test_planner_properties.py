"""More planner and placement properties: replicas agree, creations fit the room, splits are fair."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from sandfleet.core.model import Node, RegionSpec, SandboxPod
from sandfleet.core.placement import (
    RegionCapacity,
    ideal_split,
    pick_zones,
    region_capacity,
    share_at,
    split_target,
)
from sandfleet.core.resources import Resources
from tests.support.planning import (
    PLACEMENT_TEMPLATE,
    capacities,
    node,
    observed,
    pool,
    region_specs,
    run,
    valid_regions,
)

NAMES = ("us", "eu", "asia")


@settings(max_examples=200, deadline=None)
@given(region_specs, st.integers(0, 60), observed, capacities, st.floats(0, 300), st.randoms())
def test_the_plan_does_not_depend_on_the_order_things_were_seen(
    regions: list[RegionSpec],
    replicas: int,
    sandboxes: list[SandboxPod],
    capacity: dict[str, RegionCapacity],
    now: float,
    shuffler: object,
) -> None:
    # Two operator replicas (or one after a restart) list the same Pods in different orders;
    # they must decide the same thing or they would fight.
    p = pool(replicas, valid_regions(regions, replicas))
    first = run(p, sandboxes, capacity, now=now)
    shuffled = list(sandboxes)
    shuffler.shuffle(shuffled)  # type: ignore[attr-defined]
    second = run(p, shuffled, capacity, now=now)
    assert Counter(first.creates) == Counter(second.creates)
    assert set(first.deletes) == set(second.deletes)
    assert first.regions == second.regions


@settings(max_examples=300, deadline=None)
@given(region_specs, st.integers(0, 60), observed, capacities, st.floats(0, 300))
def test_creations_fit_the_free_room_of_their_zone_and_deletions_name_real_sandboxes(
    regions: list[RegionSpec],
    replicas: int,
    sandboxes: list[SandboxPod],
    capacity: dict[str, RegionCapacity],
    now: float,
) -> None:
    p = pool(replicas, valid_regions(regions, replicas))
    result = run(p, sandboxes, capacity, now=now)
    wanted = {r.name for r in p.regions}
    per_zone = Counter((c.region, c.zone) for c in result.creates)
    for (region, zone), count in per_zone.items():
        assert region in wanted
        assert zone is not None
        assert count <= capacity[region].zones.get(zone, 0)
    names = [d.name for d in result.deletes]
    assert len(names) == len(set(names)), "a sandbox is deleted once"
    assert set(names) <= {s.name for s in sandboxes}
    assert {c.region for c in result.creates} <= wanted
    assert result.target <= sum(r.max_sandboxes for r in p.regions)


@given(st.integers(0, 500), st.lists(st.integers(1, 20), min_size=1, max_size=3))
def test_split_without_limits_is_proportional_to_weight(total: int, weights: list[int]) -> None:
    regions = [RegionSpec(NAMES[i], weight=w) for i, w in enumerate(weights)]
    split = split_target(total, regions, dict.fromkeys(NAMES, 10**6))
    assert sum(split.values()) == total
    weight_sum = sum(weights)
    for spec in regions:
        exact = Fraction(total * spec.weight, weight_sum)
        assert abs(split[spec.name] - exact) < 1, (split, exact)


@given(
    st.integers(0, 200),
    st.lists(st.tuples(st.integers(1, 10), st.integers(0, 30), st.integers(0, 60)), min_size=1, max_size=3),
)
def test_split_honours_floors_within_limits(total: int, specs: list[tuple[int, int, int]]) -> None:
    regions = [RegionSpec(NAMES[i], weight=w, min_warm=f) for i, (w, f, _) in enumerate(specs)]
    limits = {NAMES[i]: limit for i, (_, _, limit) in enumerate(specs)}
    split = split_target(total, regions, limits)
    for spec in regions:
        assert split[spec.name] <= limits[spec.name]
        assert split[spec.name] >= min(spec.min_warm, limits[spec.name])
    if sum(min(s.min_warm, limits[s.name]) for s in regions) <= total:
        # Floors fit in the total: the total is placed as far as the limits allow.
        assert sum(split.values()) == min(total, sum(limits.values()))


@given(
    st.integers(0, 100),
    st.dictionaries(st.sampled_from(["a", "b", "c", ""]), st.integers(-3, 20), max_size=4),
    st.dictionaries(st.sampled_from(["a", "b", "c", ""]), st.integers(0, 20), max_size=4),
)
def test_pick_zones_fills_the_emptiest_zone_with_room_first(
    count: int, free: dict[str, int], current: dict[str, int]
) -> None:
    zones = pick_zones(count, free, current)
    room = sum(max(0, n) for n in free.values())
    assert len(zones) == min(count, room)
    placed = Counter(z or "" for z in zones)
    for zone, n in placed.items():
        assert n <= free[zone]
    # Balance: a zone left with room never has fewer sandboxes than one that got a new one had
    # when it got its last.
    totals = {z: current.get(z, 0) + placed.get(z, 0) for z in free if free[z] > 0}
    for zone, n in placed.items():
        for other, other_total in totals.items():
            if placed.get(other, 0) < free[other]:
                assert current.get(zone, 0) + n - 1 <= other_total


@given(
    st.lists(
        st.tuples(st.sampled_from(["us-a", "us-b"]), st.integers(0, 16), st.integers(0, 16)), max_size=6
    ),
    st.integers(0, 40),
)
def test_waiting_pods_take_exactly_their_share_of_free_slots(
    nodes: list[tuple[str, int, int]], waiting: int
) -> None:
    built: list[Node] = [node(f"n{i}", "us", zone, cpu=cpu) for i, (zone, cpu, _) in enumerate(nodes)]
    requested = {f"n{i}": Resources(used * 1000, 0, used) for i, (_, _, used) in enumerate(nodes)}
    regions = [RegionSpec("us")]
    before = region_capacity(built, requested, PLACEMENT_TEMPLATE, regions)["us"]
    after = region_capacity(built, requested, PLACEMENT_TEMPLATE, regions, {"us": waiting})["us"]
    assert all(n >= 0 for n in before.zones.values())
    assert after.free == max(0, before.free - waiting)
    assert after.nodes == before.nodes == len(built)


def _former_ideal_share(total: int, regions: list[RegionSpec], region: str) -> int:
    """The planner's own share formula before it was folded into placement's `share_at`."""
    weights = sum(r.weight for r in regions)
    for spec in regions:
        if spec.name == region:
            share = total * spec.weight // weights if weights else 0
            return min(spec.max_sandboxes, max(spec.min_warm, share))
    return 0


@given(
    st.integers(-5, 500),
    st.lists(
        st.tuples(st.sampled_from(NAMES), st.integers(-2, 20), st.integers(-2, 40), st.integers(-2, 80)),
        min_size=1,
        max_size=4,
    ),
)
def test_the_ideal_split_is_the_share_the_planner_used_to_compute(
    total: int, specs: list[tuple[str, int, int, int]]
) -> None:
    regions = [RegionSpec(n, weight=w, min_warm=f, max_sandboxes=m) for n, w, f, m in specs]
    ideal = ideal_split(total, regions)
    assert ideal == {r.name: _former_ideal_share(total, regions, r.name) for r in regions}


@given(st.integers(0, 500), st.lists(st.integers(1, 20), min_size=1, max_size=3))
def test_split_target_with_room_everywhere_is_the_ideal_split_up_to_rounding(
    total: int, weights: list[int]
) -> None:
    # One share rule: the split places the remainder the ideal floors away, nothing else differs.
    regions = [RegionSpec(NAMES[i], weight=w) for i, w in enumerate(weights)]
    split = split_target(total, regions, {r.name: r.max_sandboxes for r in regions})
    ideal = ideal_split(total, regions)
    assert all(0 <= split[n] - ideal[n] <= 1 for n in ideal)
    assert share_at(Fraction(2), Fraction(3), 0, 5) == 5
    assert share_at(Fraction(2), Fraction(1), 3, 5) == 3
