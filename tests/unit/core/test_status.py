from __future__ import annotations

from sandfleet.core.model import PoolSpec, RegionSpec, Template
from sandfleet.core.planner import FailureState, PoolPlan, RegionStatus
from sandfleet.core.status import conditions, merge_conditions, pool_status

POOL = PoolSpec("ns", "python", "uid", 2, 6, (RegionSpec("us"), RegionSpec("eu")), Template(image="i"))


def make_plan(ready: int, target: int = 3, wanted: int = 6, **kw: object) -> PoolPlan:
    regions = (RegionStatus("us", target, ready, 1, 0, 0, 10), RegionStatus("eu", 3, 3, 0, 0, 0, 5))
    defaults: dict[str, object] = {
        "creates": (),
        "deletes": (),
        "regions": regions,
        "target": target + 3,
        "wanted": wanted,
        "failures": FailureState(),
    }
    defaults.update(kw)
    return PoolPlan(**defaults)  # type: ignore[arg-type]


def by_type(plan: PoolPlan, now: float = 100.0) -> dict[str, dict[str, object]]:
    return {c["type"]: c for c in conditions(POOL, plan, now)}


def test_filled_pool_is_ready_and_healthy() -> None:
    found = by_type(make_plan(ready=3))
    assert found["Ready"]["status"] == "True"
    assert found["Degraded"]["status"] == "False"
    assert found["CapacityLimited"]["status"] == "False"


def test_shortfall_and_shift_are_capacity_limited() -> None:
    assert by_type(make_plan(ready=1, target=1))["CapacityLimited"]["reason"] == "NoCapacity"
    shifted = by_type(make_plan(ready=3, short_regions=("us",)))["CapacityLimited"]
    assert shifted["reason"] == "ShiftedToOtherRegions"
    assert "us" in str(shifted["message"])


def test_degraded_reports_the_backoff() -> None:
    failures = FailureState("h", 4, 10.0, 90.0)
    degraded = by_type(make_plan(ready=0, failures=failures))["Degraded"]
    assert degraded["status"] == "True"
    assert "next attempt at 1970-01-01T00:01:50Z" in str(degraded["message"])


def test_degraded_by_refused_creates_quotes_the_apiserver() -> None:
    refusal = 'pods "python-x" is forbidden: error looking up service account ns/default' + "!" * 500
    failures = FailureState("h", 3, 10.0, 90.0).record(1, 95.0, refusal)
    degraded = by_type(make_plan(ready=0, failures=failures))["Degraded"]
    message = str(degraded["message"])
    assert (degraded["status"], degraded["reason"]) == ("True", "CreatesRefused")
    assert "4 passes in a row" in message
    assert "error looking up service account ns/default" in message
    assert len(message) < 500  # quoted, not the whole of it
    # A sandbox that then fails to get Ready is the other kind of failure: the message says so.
    after = failures.record(1, 100.0)
    assert by_type(make_plan(ready=0, failures=after))["Degraded"]["reason"] == "SandboxesNotReady"


def test_degraded_by_an_image_that_cannot_be_pulled_says_so() -> None:
    pulled = 'ErrImagePull: failed to pull image "127.0.0.1:5000/x:1": 401 Unauthorized'
    failures = FailureState("h", 2, 10.0, 90.0).record(1, 95.0, broken_reason=pulled)
    degraded = by_type(make_plan(ready=0, failures=failures))["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "ImagePullFailed")
    assert "401 Unauthorized" in str(degraded["message"])
    assert "imagePullSecrets" in str(degraded["message"])
    # A later failure that says nothing new keeps the last words; another kind replaces them.
    assert failures.record(1, 99.0).broken_reason == pulled
    crashed = failures.record(1, 99.0, broken_reason="CrashLoopBackOff: back-off restarting")
    degraded = by_type(make_plan(ready=0, failures=crashed))["Degraded"]
    assert degraded["reason"] == "SandboxesNotReady"
    assert "CrashLoopBackOff" in str(degraded["message"])


def test_transition_times_survive_unchanged_statuses() -> None:
    first, changes = merge_conditions([], conditions(POOL, make_plan(ready=3), 100.0), 100.0)
    assert {c.type for c in changes} == {"Ready"}
    second, changes = merge_conditions(first, conditions(POOL, make_plan(ready=3), 200.0), 200.0)
    assert not changes
    assert second == first
    third, changes = merge_conditions(second, conditions(POOL, make_plan(ready=0), 300.0), 300.0)
    assert [c.type for c in changes] == ["Ready"]
    assert third[0]["lastTransitionTime"] == "1970-01-01T00:05:00Z"


def test_pool_status_has_scale_fields_and_per_region_counts() -> None:
    body = pool_status(POOL, make_plan(ready=3), [])
    assert body["replicas"] == 6
    assert body["selector"] == "sandfleet.dev/pool=python"
    assert body["leased"] == 1
    assert body["observedGeneration"] == 2
    assert body["regionSummary"] == "us 3/3, eu 3/3"
    assert body["regions"][0] == {
        "name": "us",
        "target": 3,
        "ready": 3,
        "leased": 1,
        "starting": 0,
        "failed": 0,
        "capacity": 10,
        "unscheduled": 0,
    }
