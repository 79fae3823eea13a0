"""Every node of one region goes NotReady: the pool's warm sandboxes move to the other regions.

Leases held in that region go on (their sandboxes still run: the control plane lost the nodes,
not the machines). Bounded: about 30 s (the nodes NotReady, the shift, the nodes back).
"""

from __future__ import annotations

import pytest

from tests.integration.faults.conftest import NOT_READY_LABEL as NOT_READY
from tests.integration.faults.conftest import TARGET, Run
from tests.support.kube import wait_until

pytestmark = pytest.mark.cluster

REGION = "asia-southeast1"


def test_a_region_going_not_ready_shifts_the_pool_to_the_others(steady: Run) -> None:
    fleet = steady.fleet
    cluster = fleet.cluster
    nodes = cluster.kubectl.json("get", "nodes", "-l", f"topology.kubernetes.io/region={REGION}")["items"]
    names = [n["metadata"]["name"] for n in nodes]
    (held,) = steady.load.hold(1, regions=[REGION])
    wait_until(lambda: sum(c.ok for c in held.calls) >= 3, 20, "the holder to use its sandbox")

    for name in names:
        cluster.kubectl("label", "node", name, f"{NOT_READY}=true")
    wait_until(lambda: not set(names) & cluster.ready_nodes(), 30, f"the nodes of {REGION} NotReady", 0.5)

    def shifted() -> bool:
        warm = fleet.warm()
        return sum(warm.values()) == TARGET and not warm.get(REGION)

    steady.load.pause_workers()
    wait_until(shifted, 60, f"{TARGET} warm sandboxes outside {REGION}", 0.5)
    steady.load.resume_workers()
    calls = len(held.calls)
    wait_until(lambda: len(held.calls) >= calls + 3, 20, "the holder to go on")
    assert held.first_lease_error is None, "a lease in the NotReady region was lost though its sandbox ran"
    steady.load.release_holders()

    for name in names:
        cluster.kubectl("label", "node", name, f"{NOT_READY}-")
    wait_until(lambda: set(names) <= cluster.ready_nodes(), 60, f"the nodes of {REGION} Ready again", 0.5)
    steady.finish()
