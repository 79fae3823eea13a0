"""A tenant cannot take the fleet: lease, group and prefetch quotas, and the pool's cap (real gVisor)."""

from __future__ import annotations

import pytest

from tests.support.capacity import (
    GROUP_QUOTA,
    LEASE_QUOTA,
    POOL_CAPACITY,
    PREFETCH_QUOTA,
    CapacityGateway,
    capacity,
    capacity_gateway,
    timed,
)

pytestmark = pytest.mark.gvisor
__all__ = ["capacity", "capacity_gateway"]


def test_prefetch_of_10000_past_the_quota_and_the_pools_cap_is_refused(capacity: CapacityGateway) -> None:
    image = capacity.pool()["image"]
    with capacity.client("tenant-a") as client:
        ten_thousand = {"pool": "python", "images": [{"image": image, "count": 10000}]}
        huge = client.post("/v1/prefetch", json=ten_thousand)
        assert huge.status_code == 422, huge.text
        assert huge.json()["error"] == "prefetch_too_large"
        assert f"quota is {PREFETCH_QUOTA}" in huge.json()["detail"]
        assert "SANDFLEET_GATEWAY_MAX_PREFETCH_PER_TENANT" in huge.json()["detail"]
        past_cap = client.post(
            "/v1/prefetch", json={"pool": "python", "images": [{"image": image, "count": POOL_CAPACITY + 1}]}
        )
        assert past_cap.status_code == 422, past_cap.text
        assert f"holds at most {POOL_CAPACITY}" in past_cap.json()["detail"]
    assert capacity.pool()["warm"] <= 2  # nothing was started for either


def test_a_tenant_holds_at_most_its_lease_quota_and_others_are_unaffected(capacity: CapacityGateway) -> None:
    with capacity.client("tenant-a") as a, capacity.client("tenant-b") as b:
        held = []
        for _ in range(LEASE_QUOTA):
            granted = a.post("/v1/leases", json={"pool": "python", "wait_seconds": 60})
            assert granted.status_code == 201, granted.text
            held.append(granted.json()["leases"][0]["id"])
        over, seconds = timed(a.post, "/v1/leases", json={"pool": "python", "wait_seconds": 30})
        assert over.status_code == 429, over.text
        assert seconds < 5  # told at once, not after a wait
        assert over.json()["error"] == "quota_exceeded"
        assert f"quota of {LEASE_QUOTA}" in over.json()["detail"]
        assert "release" in over.json()["detail"]
        assert int(over.headers["Retry-After"]) >= 1
        other = b.post("/v1/leases", json={"pool": "python", "wait_seconds": 60})
        assert other.status_code == 201, other.text  # another tenant's quota is its own
        group = b.post("/v1/leases", json={"pool": "python", "count": LEASE_QUOTA, "wait_seconds": 5})
        assert group.status_code == 429, group.text  # 1 held + a group of 3 would pass 3
        assert a.delete(f"/v1/leases/{held[0]}").status_code == 200
        again = a.post("/v1/leases", json={"pool": "python", "wait_seconds": 60})
        assert again.status_code == 201, again.text  # a released lease frees its place


def test_a_group_larger_than_the_pool_can_ever_hold_is_refused_at_once(capacity: CapacityGateway) -> None:
    with capacity.client("tenant-a") as client:
        # 205 on a pool capped at 64: before, it waited its whole wait and ended in a 5xx.
        too_big, seconds = timed(
            client.post, "/v1/leases", json={"pool": "python", "count": 205, "wait_seconds": 10}
        )
        assert too_big.status_code == 422, too_big.text
        assert seconds < 5
        assert too_big.json()["error"] == "group_too_large"
        assert f"holds at most {POOL_CAPACITY}" in too_big.json()["detail"]
        above_quota = client.post(
            "/v1/leases", json={"pool": "python", "count": GROUP_QUOTA + 1, "wait_seconds": 10}
        )
        assert above_quota.status_code == 422, above_quota.text
        assert "SANDFLEET_GATEWAY_MAX_GROUP_SIZE" in above_quota.json()["detail"]
