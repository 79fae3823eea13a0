"""How much of a pool a member cluster can hold, read from its operator's status."""

from __future__ import annotations

from sandfleet.gateway.kube import pool_room


def region(capacity: int | None = None, **counts: int) -> dict[str, object]:
    return {"name": "r", **counts, **({} if capacity is None else {"capacity": capacity})}


def test_room_is_the_warm_sandboxes_placed_plus_the_free_slots_of_every_region() -> None:
    status = {"regions": [region(3, ready=2, leased=4, starting=1), region(0, ready=5), region(-2)]}
    assert pool_room(status, max_sandboxes=100) == 2 + 1 + 3 + 5  # leased ones are on top of a warm target


def test_pods_no_node_has_taken_are_not_room() -> None:
    status = {"regions": [region(0, ready=3, starting=4, unscheduled=3)]}
    assert pool_room(status, max_sandboxes=100) == 3 + 1


def test_room_is_held_to_what_the_pools_maximum_leaves_beside_its_leased_ones() -> None:
    assert pool_room({"regions": [region(50, ready=10)]}, max_sandboxes=20) == 20
    assert pool_room({"regions": [region(50, ready=10, leased=5)]}, max_sandboxes=20) == 15
    assert pool_room({"regions": [region(50, leased=30)]}, max_sandboxes=20) == 0


def test_room_is_unknown_until_the_operator_reports_every_regions_capacity() -> None:
    assert pool_room({}, max_sandboxes=20) is None
    assert pool_room({"regions": [region(3, ready=1), region(ready=1)]}, max_sandboxes=20) is None
