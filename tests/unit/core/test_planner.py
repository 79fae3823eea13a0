from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sandfleet.core import api
from sandfleet.core.model import RegionSpec, SandboxPod
from sandfleet.core.placement import RegionCapacity
from sandfleet.core.planner import (
    DEGRADED_AFTER_FAILURES,
    LEASE_EXPIRED,
    LOST_READINESS,
    NODE_NOT_READY,
    NOT_READY_IN_TIME,
    RECYCLE_RETIRED,
    RELEASED,
    RESERVED_IDLE,
    TEMPLATE_CHANGED,
    ZONE_GONE,
    FailureState,
    PoolPlan,
)
from sandfleet.core.recycle import RESERVED_IDLE_SECONDS, RecyclePolicy
from tests.support.planning import (
    REGIONS,
    TEMPLATE,
    capacities,
    observed,
    pool,
    region_specs,
    roomy,
    run,
    sandbox,
    valid_regions,
)


def test_empty_pool_fills_every_region_by_weight_and_spreads_over_zones() -> None:
    p = pool(12, [RegionSpec("us", weight=2), RegionSpec("eu"), RegionSpec("asia")])
    result = run(p, [])
    per_region = {r.name: r.target for r in result.regions}
    assert per_region == {"us": 6, "eu": 3, "asia": 3}
    us_zones = [c.zone or "" for c in result.creates if c.region == "us"]
    assert sorted(us_zones) == ["us-a"] * 3 + ["us-b"] * 3


def test_region_without_capacity_shifts_its_share_by_weight() -> None:
    p = pool(30)
    capacity = roomy()
    capacity["asia"] = RegionCapacity(zones={"asia-a": 4}, ready_nodes=1, nodes=2)
    result = run(p, [], capacity)
    targets = {r.name: r.target for r in result.regions}
    assert targets == {"us": 13, "eu": 13, "asia": 4}
    assert result.short_regions == ("asia",)
    assert result.shortfall == 0


def test_shortfall_when_no_region_can_take_it() -> None:
    capacity = {r: RegionCapacity(zones={f"{r}-a": 2}) for r in REGIONS}
    result = run(pool(30), [], capacity)
    assert result.target == 6
    assert result.shortfall == 24


def test_sandboxes_on_not_ready_nodes_are_force_deleted_and_the_share_moves() -> None:
    p = pool(9)
    sandboxes = [sandbox(r) for r in REGIONS for _ in range(3)]
    capacity = roomy()
    capacity["asia"] = RegionCapacity(zones={}, ready_nodes=0, nodes=2)
    result = run(p, sandboxes, capacity, nodes_ready={"node-asia": False, "node-us": True, "node-eu": True})
    lost = [d for d in result.deletes if d.reason == NODE_NOT_READY]
    assert len(lost) == 3
    assert all(d.force for d in lost)
    assert {c.region for c in result.creates} == {"us", "eu"}
    assert len(result.creates) == 3


def test_released_and_expired_leases_are_reaped_live_leases_never() -> None:
    live = sandbox("us", state=api.LEASE_LEASED, lease_expires_at=1000.0)
    expired = sandbox("us", state=api.LEASE_LEASED, lease_expires_at=50.0)
    released = sandbox("eu", state=api.LEASE_RELEASED)
    result = run(pool(0), [live, expired, released])
    reasons = {d.name: d.reason for d in result.deletes}
    assert reasons == {expired.name: LEASE_EXPIRED, released.name: RELEASED}


def test_a_reserved_sandbox_counts_as_its_runs_until_idle_too_long_too_old_or_lost() -> None:
    recycling = replace(pool(1, [RegionSpec("us")]), recycle=RecyclePolicy(max_episodes=5, max_seconds=600))
    now = 200.0

    def reserved(**kw: Any) -> SandboxPod:
        held: dict[str, Any] = {"reserved_for": ("actor", "run-1"), "reserved_since": now - 1, **kw}
        return sandbox("us", state=api.LEASE_RESERVED, **held)

    kept, idle = reserved(), reserved(reserved_since=now - RESERVED_IDLE_SECONDS - 1)
    old, lost = reserved(created_at=now - 600), reserved(ready=False)
    warm = sandbox("us")
    result = run(recycling, [kept, idle, old, lost, warm], now=now)
    reasons = {d.name: d.reason for d in result.deletes}
    assert reasons == {idle.name: RESERVED_IDLE, old.name: RECYCLE_RETIRED, lost.name: LOST_READINESS}
    # The kept one is its run's: neither warm for others (the warm one stays) nor a reason to create.
    assert result.regions[0].leased == 1
    assert not result.creates
    # A pool that stopped recycling gives its reserved sandboxes up at once.
    assert [d.reason for d in run(pool(1, [RegionSpec("us")]), [kept, warm], now=now).deletes] == [
        RECYCLE_RETIRED
    ]


def test_shrinking_never_touches_leased_sandboxes() -> None:
    leased = [sandbox("us", state=api.LEASE_LEASED, lease_expires_at=1e9) for _ in range(5)]
    free = [sandbox("us") for _ in range(5)]
    result = run(pool(0, [RegionSpec("us")]), [*leased, *free])
    assert {d.name for d in result.deletes} == {s.name for s in free}


def test_template_change_rolls_warm_sandboxes_only_as_new_ones_get_ready() -> None:
    new = replace(TEMPLATE, image="sandfleet/sandbox:0.2.0")
    p = pool(3, [RegionSpec("us")], template=new)
    old = [sandbox("us") for _ in range(3)]
    old_leased = sandbox("us", state=api.LEASE_LEASED, lease_expires_at=1e9)
    first = run(p, [*old, old_leased])
    assert len(first.creates) == 3
    assert not first.deletes
    fresh = [sandbox("us", template_hash=new.hash) for _ in range(2)]
    second = run(p, [*old, old_leased, *fresh])
    assert len(second.deletes) == 2
    assert all(d.reason == TEMPLATE_CHANGED for d in second.deletes)
    assert old_leased.name not in {d.name for d in second.deletes}


def test_a_sandbox_not_ready_by_the_deadline_is_replaced() -> None:
    stuck = sandbox("us", ready=False, created_at=0.0)
    result = run(pool(1, [RegionSpec("us")]), [stuck], now=61.0)
    assert [d.reason for d in result.deletes] == [NOT_READY_IN_TIME]
    assert len(result.creates) == 1
    assert result.failures.streak == 1


def test_an_unscheduled_sandbox_pinned_to_a_zone_without_nodes_is_replaced_at_once() -> None:
    stranded = sandbox("us", ready=False, node=None, zone="us-c", created_at=99.0)
    waiting = sandbox("us", ready=False, node=None, zone="us-a", created_at=99.0)
    result = run(pool(2, [RegionSpec("us")]), [stranded, waiting], now=100.0)
    assert [(d.name, d.reason) for d in result.deletes] == [(stranded.name, ZONE_GONE)]
    assert all(c.zone != "us-c" for c in result.creates)
    assert len(result.creates) == 1
    assert result.failures.streak == 0  # the image is not to blame


def test_a_regions_status_counts_the_starting_sandboxes_no_node_has_taken() -> None:
    placed = sandbox("us", ready=False, created_at=99.0)
    waiting = [sandbox("us", ready=False, node=None, zone="us-a", created_at=99.0) for _ in range(2)]
    (us,) = run(pool(3, [RegionSpec("us")]), [placed, *waiting], now=100.0).regions
    assert (us.starting, us.unscheduled) == (3, 2)


def test_broken_image_degrades_and_backs_off_instead_of_churning() -> None:
    p = pool(5, [RegionSpec("us")])
    stuck = [sandbox("us", ready=False, created_at=0.0) for _ in range(5)]
    result = run(p, stuck, now=61.0)
    assert result.failures.degraded
    assert result.failures.streak == 5
    assert not result.creates, "no replacement before the backoff"
    assert result.retry_at is not None
    assert result.retry_at > 61.0
    later = run(p, [], now=result.retry_at, failures=result.failures)
    assert len(later.creates) == 1, "one probe after the backoff"
    probing = run(
        p,
        [sandbox("us", ready=False, created_at=result.retry_at)],
        now=result.retry_at + 1,
        failures=result.failures,
    )
    assert not probing.creates, "no second probe while the first still starts"


def test_a_broken_sandbox_leaves_its_reason_in_the_failures() -> None:
    p = pool(2, [RegionSpec("us")])
    reason = "ErrImagePull: 401 Unauthorized"
    pulling = [replace(sandbox("us", ready=False, created_at=99.0), broken=True, broken_reason=reason)]
    result = run(p, pulling, now=100.0)
    assert result.failures.streak == 1
    assert result.failures.broken_reason == reason


def test_recovery_clears_the_streak() -> None:
    failures = FailureState(TEMPLATE.hash, DEGRADED_AFTER_FAILURES + 1, 10.0, 20.0)
    healthy = sandbox("us", created_at=30.0)
    result = run(pool(2, [RegionSpec("us")]), [healthy], now=40.0, failures=failures)
    assert not result.failures.degraded
    assert len(result.creates) == 1


def test_shift_back_keeps_the_pool_warm_until_the_new_region_is_ready() -> None:
    p = pool(6, [RegionSpec("us"), RegionSpec("eu")])
    sandboxes = [sandbox("us") for _ in range(6)]
    result = run(p, sandboxes)
    assert len(result.creates) == 3
    assert not result.deletes
    starting = [sandbox("eu", ready=False, created_at=99.0) for _ in range(3)]
    assert not run(p, [*sandboxes, *starting]).deletes
    ready = [replace(s, ready=True) for s in starting]
    assert len(run(p, [*sandboxes, *ready]).deletes) == 3


# -- properties -------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(region_specs, st.integers(0, 60), observed, capacities, st.floats(0, 300))
def test_never_creates_above_a_regions_maximum(
    regions: list[RegionSpec],
    replicas: int,
    sandboxes: list[SandboxPod],
    capacity: dict[str, RegionCapacity],
    now: float,
) -> None:
    p = pool(replicas, valid_regions(regions, replicas))
    result = run(p, sandboxes, capacity, now=now)
    deleted = {d.name for d in result.deletes}
    for spec in p.regions:
        kept = [s for s in sandboxes if s.region == spec.name and s.name not in deleted]
        created = [c for c in result.creates if c.region == spec.name]
        if created:
            assert len(kept) + len(created) <= spec.max_sandboxes
        free_slots = sum(capacity[spec.name].zones.values())
        assert len(created) <= free_slots


@settings(max_examples=300, deadline=None)
@given(region_specs, st.integers(0, 60), observed, capacities, st.floats(0, 300))
def test_never_deletes_a_live_lease(
    regions: list[RegionSpec],
    replicas: int,
    sandboxes: list[SandboxPod],
    capacity: dict[str, RegionCapacity],
    now: float,
) -> None:
    result = run(pool(replicas, valid_regions(regions, replicas)), sandboxes, capacity, now=now)
    deleted = {d.name for d in result.deletes}
    for s in sandboxes:
        if s.leased and (s.lease_expires_at is None or s.lease_expires_at > now):
            assert s.name not in deleted


def _apply(result: PoolPlan, sandboxes: list[SandboxPod], now: float, template_hash: str) -> list[SandboxPod]:
    deleted = {d.name for d in result.deletes}
    kept = [replace(s, ready=True) if s.free else s for s in sandboxes if s.name not in deleted]
    made = [
        sandbox(c.region, zone=c.zone, template_hash=c.template_hash, ready=False, created_at=now)
        for c in result.creates
    ]
    return [*kept, *made]


def _capacity(slots: dict[str, int], sandboxes: list[SandboxPod]) -> dict[str, RegionCapacity]:
    return {
        r: RegionCapacity(zones={f"{r}-a": max(0, slots[r] - sum(s.region == r for s in sandboxes))})
        for r in REGIONS
    }


@settings(max_examples=200, deadline=None)
@given(
    region_specs,
    st.integers(0, 60),
    observed,
    st.fixed_dictionaries({r: st.integers(0, 50) for r in REGIONS}),
)
def test_converges_to_a_quiet_plan_that_meets_targets(
    regions: list[RegionSpec], replicas: int, sandboxes: list[SandboxPod], slots: dict[str, int]
) -> None:
    p = pool(replicas, valid_regions(regions, replicas))
    now = 300.0
    state = list(sandboxes)
    for _ in range(12):
        result = run(p, state, _capacity(slots, state), now=now)
        if not result.creates and not result.deletes and result.starting == 0:
            break
        state = _apply(result, state, now, TEMPLATE.hash)
        now += 1.0
    else:
        raise AssertionError(f"no quiet plan after 12 rounds: {result}")
    for region in result.regions:
        assert region.ready == region.target
    if result.shortfall:
        # Short only when every region is at its maximum or out of capacity.
        specs = {r.name: r for r in p.regions}
        for region in result.regions:
            assert region.target >= specs[region.name].max_sandboxes - region.leased or region.capacity == 0


def test_a_sandbox_that_lost_readiness_gets_the_deadline_again_and_is_no_failure() -> None:
    p = pool(1, [RegionSpec("us")])
    blip = sandbox("us", ready=False, started=True, unready_since=90.0, created_at=0.0)
    waiting = run(p, [blip], now=100.0)
    assert not waiting.deletes, "a short blip is waited out"
    assert not waiting.creates
    gone = run(p, [blip], now=151.0)
    assert [d.reason for d in gone.deletes] == [LOST_READINESS]
    assert gone.failures.streak == 0
    assert len(gone.creates) == 1
