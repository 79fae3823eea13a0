"""A recycling pool against a real apiserver: a run's next lease claims the Pod its last one left
reserved (no other run's does), and a reset that fails leaves its Pod released.

The reset that succeeds runs on the real gVisor node (tests/e2e/helm): an agent on this host must
never empty the host's /tmp and /root. Here the agent on loopback was started without a pristine
copy, so it refuses the reset, as an agent would whose copy could not be made.
"""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sandfleet.client import Fleet, NoSandboxInTime
from sandfleet.core import api
from tests.integration.gateway.conftest import STORES, GatewayFactory, Pool, loopback_sandbox, pool_manifest

pytestmark = pytest.mark.cluster


def resets(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        sample.labels["result"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "sandfleet_sandbox_resets"
        for sample in family.samples
        if sample.name == "sandfleet_sandbox_resets_total"
    }


@STORES
def test_a_sandbox_whose_reset_fails_is_released_for_deletion_and_never_handed_out(
    pool: Pool, start_gateway: GatewayFactory, agent: int
) -> None:
    recycling = pool_manifest("python", store=pool.store)
    recycling["spec"]["recycle"] = {"maxEpisodes": 5, "maxSeconds": 3600}
    pool.kube.apply(recycling)
    name = loopback_sandbox(pool, agent)
    gateway = start_gateway()
    with Fleet(gateway.url, token="actor-token") as fleet:
        with fleet.lease("python", labels={"run": "r1"}) as sandbox:
            assert sandbox.exec(["true"]).exit_code == 0
            assert sandbox.lease.sandbox == name
        assert pool.states()[name] == api.LEASE_RELEASED
        assert resets(gateway.url) == {"reset_failed": 1.0}
        # Released is never leased again, not even by its own run.
        with pytest.raises(NoSandboxInTime), fleet.lease("python", labels={"run": "r1"}, wait_seconds=2):
            pass


@STORES
def test_a_runs_next_lease_claims_its_reserved_pod_and_other_runs_get_warm_ones(
    pool: Pool, start_gateway: GatewayFactory
) -> None:
    recycling = pool_manifest("python", store=pool.store)
    recycling["spec"]["recycle"] = {"maxEpisodes": 5, "maxSeconds": 3600}
    pool.kube.apply(recycling)
    kept, warm = pool.add_sandboxes(2, region="us-east1")
    pool.write_reservation(kept, "actor-0", "r1", episodes=1)
    gateway = start_gateway()
    with Fleet(gateway.url, token="actor-token") as fleet:
        with fleet.lease("python", labels={"run": "r2"}) as other:
            assert other.lease.sandbox == warm  # another run never gets it
        (ours,) = fleet.acquire("python", labels={"run": "r1"})
        assert ours.sandbox == kept
        assert ours.id == f"{pool.kube.namespace}.{kept}~1"
        assert pool.states()[kept] == api.LEASE_LEASED
        fleet.release(ours.id)
