"""Batch acquires through a real gateway on the real apiserver; the truth is read from the cluster."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from sandfleet.core import api
from sandfleet.core.leases import LeaseRecord
from sandfleet.core.model import lease_episode
from tests.integration.gateway.conftest import GatewayFactory, Pool
from tests.support.invariants import ClientLease, ObservedLease, PodTruth, double_leases, unrecorded_leases
from tests.support.kube import wait_until

pytestmark = pytest.mark.cluster


def batch(client: httpx.Client, count: int, min_count: int, wait: float, **body: Any) -> httpx.Response:
    return client.post(
        "/v1/leases",
        json={"pool": "python", "count": count, "min_count": min_count, "wait_seconds": wait, **body},
    )


def grants(response: httpx.Response, at: float) -> list[ClientLease]:
    """What a client was granted (every acquire here carries an idempotency key, which names it)."""
    return [
        ClientLease(
            lease["idempotency_key"],
            lease["sandbox"],
            at,
            lease["expires_at"],
            episode=lease_episode(lease["id"]) or 0,
        )
        for lease in response.json()["leases"]
    ]


def pod_truth(pool: Pool) -> list[PodTruth]:
    truth = []
    recorded = pool.leases_on_pods()
    for pod in pool.pods():
        raw = recorded.get(pod["metadata"]["name"])
        leases = []
        if raw:
            leases.append(
                ObservedLease(raw["idempotency_key"] or raw["holder"], raw["holder"],
                              raw["acquired_at"], raw["expires_at"])
            )  # fmt: skip
        truth.append(PodTruth(pod["metadata"]["name"], pod["metadata"]["uid"], leases=leases))
    return truth


def states(pool: Pool) -> dict[str, int]:
    return dict(Counter(pool.states().values()))


def test_a_batch_from_a_short_pool_returns_what_is_there_after_its_wait_and_nothing_twice(
    pool: Pool, start_gateway: GatewayFactory
) -> None:
    pool.add_sandboxes(12)
    gateway = start_gateway()
    with gateway.client() as client:
        started = time.monotonic()
        short = batch(client, 20, 10, 2.0, idempotency_key="step-1")
        waited = time.monotonic() - started
        assert short.status_code == 201, short.text
        body = short.json()
        assert (body["requested"], body["granted"], len(body["leases"])) == (20, 12, 12)
        assert 2.0 <= waited < 10  # it waited for the 8 more, then took the 12 there were
        clients = grants(short, time.time())
        retried = batch(client, 20, 10, 2.0, idempotency_key="step-1")  # the whole batch, again
        assert sorted(x["id"] for x in retried.json()["leases"]) == sorted(x["id"] for x in body["leases"])

        # Two batches and four singles racing for 10 more: each sandbox to one of them.
        pool.add_sandboxes(10, prefix="more")

        async def race() -> list[httpx.Response]:
            async with httpx.AsyncClient(
                base_url=gateway.url, headers={"Authorization": "Bearer actor-token"}, timeout=30
            ) as racer:
                bodies = [{"count": 6, "min_count": 1, "idempotency_key": f"b{i}"} for i in range(2)]
                bodies += [{"idempotency_key": f"s{i}"} for i in range(4)]
                return await asyncio.gather(
                    *(
                        racer.post("/v1/leases", json={"pool": "python", "wait_seconds": 1.5, **b})
                        for b in bodies
                    )
                )

        raced = asyncio.run(race())
        granted_at = time.time()
        assert {r.status_code for r in raced} <= {201, 504}, [r.text for r in raced]
        for response in raced:
            if response.status_code == 201:
                clients += grants(response, granted_at)
        assert len(clients) == 22  # all of both rounds' sandboxes went to someone
        truth = pod_truth(pool)
        assert double_leases(truth, clients) == []
        assert unrecorded_leases(clients, truth) == []
        assert states(pool) == {api.LEASE_LEASED: 22}


def test_a_batch_below_its_minimum_at_the_deadline_keeps_nothing(
    pool: Pool, start_gateway: GatewayFactory
) -> None:
    pool.add_sandboxes(4)
    gateway = start_gateway()
    with gateway.client() as client:
        refused = batch(client, 20, 10, 1.0)
        assert refused.status_code == 504, refused.text
        problem = refused.json()
        assert problem["error"] == "no_sandbox_in_time"
        assert problem["queue_position"] == 1
        assert problem["eta_seconds"] >= 0
        # Its 4 partial claims went back warm: the Pods say so, and they can be leased again.
        deadline = time.monotonic() + 10
        while states(pool) != {api.LEASE_FREE: 4} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert states(pool) == {api.LEASE_FREE: 4}
        assert pool.leases_on_pods() == {}
        again = batch(client, 4, 4, 2.0)
        assert again.status_code == 201, again.text


def test_a_batch_larger_than_the_quota_is_refused_at_once_saying_which_limit(
    pool: Pool, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway()  # the default quotas: 2,000 leases per tenant, batches of 4,096
    with gateway.client() as client:
        for count, limit in ((2001, "SANDFLEET_GATEWAY_MAX_LEASES_PER_TENANT"),
                             (4097, "SANDFLEET_GATEWAY_MAX_BATCH_SIZE")):  # fmt: skip
            started = time.monotonic()
            refused = batch(client, count, 1, 30.0)
            assert time.monotonic() - started < 5  # not after its wait
            assert refused.status_code == 422, refused.text
            assert refused.json()["error"] == "batch_too_large"
            assert limit in refused.json()["detail"]
        upside_down = batch(client, 4, 5, 1.0)
        assert upside_down.status_code == 422
        assert "min_count (5) is above count (4)" in upside_down.json()["detail"]
        beyond = batch(client, 10_001, 1, 1.0)
        assert beyond.status_code == 422
        assert "count" in beyond.json()["detail"]
    assert pool.pods() == []  # nothing was claimed, nothing was created


def _dead_replicas_claim(pool: Pool, name: str, key: str, acquired_at: float) -> None:
    """Record what a replica killed mid-batch had claimed for actor-0 under `key`."""
    lease = LeaseRecord(
        id=f"{pool.kube.namespace}.{name}", pool=pool.name, holder="actor-0", acquired_at=acquired_at,
        expires_at=acquired_at + 120, ttl_seconds=120, idempotency_key=key, attempt="the-dead-replicas",
    )  # fmt: skip
    pool.write_claim(name, lease)


def test_a_dead_replicas_late_claim_never_changes_what_a_retry_was_answered(
    pool: Pool, start_gateway: GatewayFactory
) -> None:
    """A claim of the killed replica that lands after a retry was answered stays out of every later answer."""
    names = pool.add_sandboxes(8)
    now = time.time()
    # It died with 2 claims on the Pods, below the batch's minimum of 3: nobody was answered.
    for name in names[:2]:
        _dead_replicas_claim(pool, name, "step-9", now)
    gateway = start_gateway()
    with gateway.client() as client:
        first = batch(client, 5, 3, 5.0, idempotency_key="step-9")
        assert first.status_code == 201, first.text
        answered = sorted(lease["sandbox"] for lease in first.json()["leases"])
        assert set(names[:2]) <= set(answered)  # adopted, and the rest claimed
        assert len(answered) == 5
        # One more claim of the dead replica reaches the Pods only now (it was still in flight).
        late = next(name for name in names if name not in answered)
        _dead_replicas_claim(pool, late, "step-9", now + 0.01)

        def seen() -> bool:  # the gateway's own view (its watch) holds the late claim
            listed = client.get("/v1/leases", params={"pool": pool.name}).json()["leases"]
            return late in {lease["sandbox"] for lease in listed}

        wait_until(seen, 10, "the gateway to see the late claim", 0.1)
        again = batch(client, 5, 3, 5.0, idempotency_key="step-9")
        assert again.status_code == 201, again.text
        assert sorted(lease["sandbox"] for lease in again.json()["leases"]) == answered
    assert pool.leases_on_pods()[late]["attempt"] == "the-dead-replicas"  # left to its TTL, never handed out
