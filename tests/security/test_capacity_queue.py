"""Head-of-line blocking is bounded and groups are not starved; /v1/pools counts only live sandboxes.

Real `sandfleet serve --local` over real gVisor, pool of 2 warm, overtaking bound 2 s.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.capacity import CapacityGateway, capacity, capacity_gateway, timed
from tests.support.kube import wait_until

pytestmark = pytest.mark.gvisor
__all__ = ["capacity", "capacity_gateway"]


def test_a_group_at_the_head_does_not_block_a_single_behind_it_and_is_served_itself(
    capacity: CapacityGateway,
) -> None:
    # A group of 3 on a pool that keeps 2 warm: it cannot be served from what is warm now.
    with capacity.client("tenant-a") as a, capacity.client("tenant-b") as b, ThreadPoolExecutor(1) as pool:
        group = pool.submit(
            timed, a.post, "/v1/leases", json={"pool": "python", "count": 3, "wait_seconds": 40}
        )
        # The single is sent once /v1/pools shows the group queued, so it arrives behind it.
        wait_until(
            lambda: group.done() or capacity.pool()["waiting"] == 1,
            timeout=20,
            what="the group of 3 to be queued",
            interval=0.05,
        )
        assert not group.done(), f"the group was served before it queued: {group.result()[0].text}"
        single, seconds = timed(b.post, "/v1/leases", json={"pool": "python", "wait_seconds": 8})
        assert single.status_code == 201, single.text  # before: 504 after its whole wait
        assert seconds < 4
        assert single.json()["queue_position"] == 1  # it arrived behind the group and overtook it
        granted, group_seconds = group.result(timeout=60)
        assert granted.status_code == 201, granted.text  # the group collects refills until whole
        assert len(granted.json()["leases"]) == 3
        assert group_seconds < 40


def test_after_a_pool_shrinks_pools_counts_only_live_warm_sandboxes(capacity: CapacityGateway) -> None:
    image = capacity.pool()["image"]
    with capacity.client("tenant-a") as client:
        grown = client.post(
            "/v1/prefetch",
            json={"pool": "python", "images": [{"image": image, "count": 5}], "ttl_seconds": 15},
        )
        assert grown.status_code == 200, grown.text
        wait_until(lambda: capacity.pool()["warm"] == 5, timeout=90, what="the pool grown to 5 warm")
        # The prefetch runs out and the pool shrinks back to 2: three warm sandboxes are destroyed.
        wait_until(lambda: capacity.pool()["warm"] == 2, timeout=45, what="/v1/pools to say 2 warm")
        time.sleep(2)
        assert capacity.pool()["warm"] == 2  # before: 5 warm reported with 2 alive
        # And the two it reports are alive: each is leased and runs a command.
        for _ in range(2):
            granted = client.post("/v1/leases", json={"pool": "python", "wait_seconds": 0})
            assert granted.status_code == 201, granted.text
            lease = granted.json()["leases"][0]["id"]
            ran = client.post(f"/v1/leases/{lease}/exec", json={"argv": ["true"]}, timeout=20)
            assert ran.status_code == 200, ran.text
            assert ran.json()["exit_code"] == 0
