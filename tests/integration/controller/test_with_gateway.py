"""The operator and the gateway together: leases take sandboxes out of the pool, the operator
refills behind them, and released sandboxes are deleted, never handed out again."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from sandfleet.core import api
from tests.integration.controller.conftest import OperatorProcess, pods, pool_manifest
from tests.integration.gateway.conftest import GatewayFactory, start_gateway
from tests.support import leases as recorded_leases
from tests.support.kube import Kubectl, wait_until

pytestmark = pytest.mark.cluster
__all__ = ["start_gateway"]  # the fixture, imported for this module's tests


def states(kube: Kubectl) -> Counter[str]:
    live = [s for s in recorded_leases.read(kube, f"{api.POOL_LABEL}=python").values() if not s.terminating]
    return Counter(s.state for s in live)


def ready_free(kube: Kubectl) -> int:
    return sum(s.warm for s in recorded_leases.read(kube, f"{api.POOL_LABEL}=python").values())


def test_leases_drain_the_pool_and_the_operator_refills_and_reaps(
    kube: Kubectl,
    start_operator: Callable[[], OperatorProcess],
    start_gateway: GatewayFactory,
) -> None:
    pool = pool_manifest("python", 6)
    pool["spec"]["lease"] = {"defaultTTLSeconds": 300, "maxTTLSeconds": 3600}
    kube.apply(pool)
    start_operator()
    wait_until(lambda: ready_free(kube) == 6, timeout=90, what="6 warm sandboxes")
    gateway = start_gateway()
    with gateway.client() as client:
        leases = [
            client.post("/v1/leases", json={"pool": "python", "labels": {"run": "r"}}) for _ in range(3)
        ]
        assert [r.status_code for r in leases] == [201, 201, 201]
        # The operator keeps 6 warm beside the 3 leased ones.
        wait_until(lambda: ready_free(kube) == 6, timeout=90, what="the pool to refill")
        assert states(kube)[api.LEASE_LEASED] == 3
        leased = {r.json()["leases"][0]["sandbox"] for r in leases}
        assert len(client.post("/v1/runs/r/release").json()["released"]) == 3
    # Released sandboxes are deleted, not returned to the pool.
    wait_until(
        lambda: not leased & {p["metadata"]["name"] for p in pods(kube, "python")},
        timeout=90,
        what="the released sandboxes to be deleted",
    )
    wait_until(lambda: states(kube) == {api.LEASE_FREE: 6}, timeout=90, what="6 free, nothing else")
