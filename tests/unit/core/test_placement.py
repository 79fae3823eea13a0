from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.model import RegionSpec, Taint, Template
from sandfleet.core.placement import node_accepts, pick_zones, region_capacity, split_target, tolerates
from sandfleet.core.resources import Resources
from tests.support.planning import PLACEMENT_TEMPLATE, node


def test_capacity_is_allocatable_minus_requests_per_zone() -> None:
    nodes = [node("a", "us", "us-a"), node("b", "us", "us-b"), node("c", "eu", "eu-a", cpu=4)]
    requested = {"a": Resources(6000, 0, 3)}
    capacity = region_capacity(nodes, requested, PLACEMENT_TEMPLATE, [RegionSpec("us"), RegionSpec("eu")])
    assert dict(capacity["us"].zones) == {"us-a": 2, "us-b": 8}
    assert capacity["eu"].free == 4


def test_not_ready_cordoned_and_tainted_nodes_give_no_capacity() -> None:
    nodes = [
        node("down", "us", "us-a", ready=False),
        node("cordoned", "us", "us-a", schedulable=False),
        node("gpu", "us", "us-b", taints=(Taint("nvidia.com/gpu", "present", "NoSchedule"),)),
    ]
    capacity = region_capacity(nodes, {}, PLACEMENT_TEMPLATE, [RegionSpec("us")])
    assert capacity["us"].free == 0
    assert capacity["us"].ready_nodes == 2
    assert capacity["us"].nodes == 3


def test_unscheduled_sandboxes_take_slots_off_the_fullest_zone() -> None:
    nodes = [node("a", "us", "us-a", cpu=2), node("b", "us", "us-b", cpu=5)]
    capacity = region_capacity(nodes, {}, PLACEMENT_TEMPLATE, [RegionSpec("us")], unscheduled={"us": 4})
    assert dict(capacity["us"].zones) == {"us-a": 1, "us-b": 2}


def test_zones_listed_in_the_region_restrict_placement() -> None:
    nodes = [node("a", "us", "us-a"), node("b", "us", "us-b")]
    capacity = region_capacity(nodes, {}, PLACEMENT_TEMPLATE, [RegionSpec("us", zones=("us-b",))])
    assert set(capacity["us"].zones) == {"us-b"}


def test_tolerations() -> None:
    taint = Taint("nvidia.com/gpu", "present", "NoSchedule")
    assert tolerates([{"key": "nvidia.com/gpu", "operator": "Exists"}], taint)
    assert tolerates([{"operator": "Exists"}], taint)
    assert tolerates([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}], taint)
    assert not tolerates([{"key": "nvidia.com/gpu", "value": "absent"}], taint)
    assert not tolerates([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}], taint)
    gpu = node("g", "us", "us-a", taints=(taint,))
    assert node_accepts(gpu, Template(image="i", tolerations=({"operator": "Exists"},)))


def test_node_selector_must_match() -> None:
    picky = Template(image="i", node_selector={"pool": "sandbox"})
    assert not node_accepts(node("a", "us", "us-a"), picky)
    assert node_accepts(node("a", "us", "us-a", labels={"pool": "sandbox"}), picky)


def test_split_by_weight_with_floor_and_limit() -> None:
    regions = [RegionSpec("us", weight=2), RegionSpec("eu", weight=1, min_warm=5), RegionSpec("asia")]
    assert split_target(12, regions, {"us": 100, "eu": 100, "asia": 100}) == {"us": 5, "eu": 5, "asia": 2}
    assert split_target(12, regions, {"us": 100, "eu": 100, "asia": 0}) == {"us": 7, "eu": 5, "asia": 0}


def test_pick_zones_balances_within_room() -> None:
    assert pick_zones(4, {"a": 10, "b": 1}, {"a": 0, "b": 0}) == ["a", "b", "a", "a"]
    assert pick_zones(3, {"a": 1}, {}) == ["a"]


limits = st.dictionaries(st.sampled_from(["us", "eu", "asia"]), st.integers(0, 50), min_size=3, max_size=3)
weights = st.tuples(st.integers(1, 10), st.integers(1, 10), st.integers(1, 10))


@given(st.integers(0, 200), limits, weights)
def test_split_never_exceeds_limits_and_places_all_it_can(
    total: int, limit: dict[str, int], weight: tuple[int, int, int]
) -> None:
    regions = [RegionSpec(n, weight=w) for n, w in zip(["us", "eu", "asia"], weight, strict=True)]
    split = split_target(total, regions, limit)
    assert all(0 <= split[n] <= limit[n] for n in split)
    assert sum(split.values()) == min(total, sum(limit.values()))
