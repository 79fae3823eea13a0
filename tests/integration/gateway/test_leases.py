"""Leases through real gateway processes on the real apiserver; the truth is read from the cluster.

The pools keep their leases in the ledger (the default); the tests marked STORES run for the `pod`
store too, which stays selectable (spec.lease.store).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import datetime
from typing import Any

import httpx
import pytest

from sandfleet.core import api
from tests.integration.gateway.conftest import STORES, GatewayFactory, Pool, sandbox_pod, wait_for
from tests.support.kube import Kubectl

pytestmark = pytest.mark.cluster


def acquire(client: httpx.Client, **body: Any) -> httpx.Response:
    return client.post("/v1/leases", json={"pool": "python", **body})


@STORES
def test_a_lease_is_recorded_in_the_cluster_and_release_marks_it(
    pool: Pool, start_gateway: GatewayFactory
) -> None:
    pool.add_sandboxes(3)
    gateway = start_gateway()
    with gateway.client() as client:
        response = acquire(client, labels={"run": "r1", "episode": "7"}, policy_version=4)
        assert response.status_code == 201, response.text
        body = response.json()
        (lease,) = body["leases"]
        assert body["queue_position"] == 0
        assert set(body["timings"]) >= {"queue_ms", "claim_ms", "boot_ms", "total_ms"}
        assert pool.states()[lease["sandbox"]] == api.LEASE_LEASED
        recorded = pool.leases_on_pods()[lease["sandbox"]]
        assert (recorded["policy_version"], recorded["labels"]["run"]) == (4, "r1")
        if pool.store == api.STORE_POD:  # kubectl selects a Pod-store lease by run
            pod = pool.kube.json("get", "pod", lease["sandbox"])
            assert pod["metadata"]["labels"][api.RUN_LABEL] == "r1"

        assert client.get(f"/v1/leases/{lease['id']}").json()["lease"]["holder"] == "actor-0"
        assert [x["id"] for x in client.get("/v1/leases", params={"run": "r1"}).json()["leases"]] == [
            lease["id"]
        ]
        released = client.delete(f"/v1/leases/{lease['id']}")
        assert released.json() == {"id": lease["id"], "released": True}
        again = client.delete(f"/v1/leases/{lease['id']}")
        assert again.status_code == 200
        assert again.json()["released"] is False
        assert pool.states()[lease["sandbox"]] == api.LEASE_RELEASED
        gone = client.get(f"/v1/leases/{lease['id']}")
        assert gone.status_code == 410
        assert "released" in gone.json()["detail"]


@STORES
def test_500_concurrent_acquires_over_3_gateways_never_lease_a_sandbox_twice(
    pool: Pool, start_gateway: GatewayFactory
) -> None:
    pool.add_sandboxes(300)
    gateways = [start_gateway() for _ in range(3)]

    async def burst() -> list[httpx.Response]:
        clients = [
            httpx.AsyncClient(
                base_url=g.url,
                headers={"Authorization": "Bearer actor-token"},
                timeout=60,
                limits=httpx.Limits(max_connections=200),
            )
            for g in gateways
        ]
        try:
            return await asyncio.gather(
                *(
                    clients[i % 3].post("/v1/leases", json={"pool": "python", "wait_seconds": 20})
                    for i in range(500)
                )
            )
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))

    responses = asyncio.run(burst())
    statuses = Counter(r.status_code for r in responses)
    assert set(statuses) <= {201, 504}, statuses
    granted = [r.json()["leases"][0] for r in responses if r.status_code == 201]
    assert len(granted) == 300, statuses
    assert len({g["sandbox"] for g in granted}) == 300
    # The cluster agrees: exactly the 300 granted leases, each on its own Pod.
    on_pods = pool.leases_on_pods()
    assert {pod: lease["id"] for pod, lease in on_pods.items()} == {g["sandbox"]: g["id"] for g in granted}
    for timeout in (r for r in responses if r.status_code == 504):
        assert timeout.json()["queue_position"] >= 1
        assert int(timeout.headers["Retry-After"]) >= 1


def test_killing_a_gateway_loses_no_lease(pool: Pool, start_gateway: GatewayFactory) -> None:
    pool.add_sandboxes(6)
    first, second = start_gateway(), start_gateway()
    with first.client() as client:
        ids = [acquire(client).json()["leases"][0]["id"] for _ in range(4)]
    first.kill()
    with second.client() as client:
        for lease_id in ids:
            got = client.get(f"/v1/leases/{lease_id}")
            assert got.status_code == 200, got.text
            assert client.post(f"/v1/leases/{lease_id}/renew", json={}).status_code == 200
        # The 2 sandboxes nobody leased are still handed out, and nothing else.
        more = [acquire(client, wait_seconds=1) for _ in range(3)]
        assert [r.status_code for r in more] == [201, 201, 504]


def test_expired_lease_is_gone_and_its_sandbox_never_handed_out_again(
    pool: Pool, start_gateway: GatewayFactory
) -> None:
    pool.add_sandboxes(1)
    gateway = start_gateway()
    with gateway.client() as client:
        lease = acquire(client, ttl_seconds=1).json()["leases"][0]
        time.sleep(1.2)
        expired = client.get(f"/v1/leases/{lease['id']}")
        assert expired.status_code == 410
        assert "expired" in expired.json()["detail"]
        assert client.post(f"/v1/leases/{lease['id']}/renew", json={}).status_code == 410
        assert acquire(client, wait_seconds=0.5).status_code == 504


def test_ttl_above_the_pool_maximum_is_refused(pool: Pool, start_gateway: GatewayFactory) -> None:
    pool.add_sandboxes(1)
    with start_gateway().client() as client:
        refused = acquire(client, ttl_seconds=7200)
        assert refused.status_code == 422
        assert "above this pool's maximum of 3600" in refused.json()["detail"]


def test_group_acquire_is_all_or_nothing_under_contention(pool: Pool, start_gateway: GatewayFactory) -> None:
    pool.add_sandboxes(5)
    gateway = start_gateway()

    async def two_groups() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=gateway.url, headers={"Authorization": "Bearer actor-token"}, timeout=30
        ) as client:
            return await asyncio.gather(
                *(
                    client.post("/v1/leases", json={"pool": "python", "count": 4, "wait_seconds": 2})
                    for _ in range(2)
                )
            )

    responses = asyncio.run(two_groups())
    assert sorted(r.status_code for r in responses) == [201, 504]
    winner = next(r for r in responses if r.status_code == 201)
    assert len(winner.json()["leases"]) == 4
    states = Counter(pool.states().values())
    assert (states[api.LEASE_LEASED], states[api.LEASE_FREE]) == (4, 1)


def test_waiters_are_served_in_order_when_sandboxes_arrive(pool: Pool, start_gateway: GatewayFactory) -> None:
    gateway = start_gateway()

    async def wait_then_add() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=gateway.url, headers={"Authorization": "Bearer actor-token"}, timeout=60
        ) as client:

            async def queued() -> int:
                pools = (await client.get("/v1/pools")).json()["pools"]
                return int(next(p for p in pools if p["name"] == "python")["waiting"])

            waiting = []
            for episode in range(3):
                waiting.append(
                    asyncio.create_task(
                        client.post(
                            "/v1/leases",
                            json={"pool": "python", "labels": {"episode": str(episode)}},
                        )
                    )
                )
                # Each is queued before the next is sent: they arrive in a known order.
                deadline = time.monotonic() + 30
                while await queued() != episode + 1:
                    assert not waiting[-1].done(), (await waiting[-1]).text
                    assert time.monotonic() < deadline, f"acquire {episode} not queued within 30 s"
                    await asyncio.sleep(0.05)
            assert await queued() == 3
            await asyncio.to_thread(pool.add_sandboxes, 3)
            return list(await asyncio.gather(*waiting))

    responses = asyncio.run(wait_then_add())
    assert [r.status_code for r in responses] == [201, 201, 201]
    assert [r.json()["queue_position"] for r in responses] == [0, 1, 2]


def test_full_queue_is_429_with_retry_after(pool: Pool, start_gateway: GatewayFactory) -> None:
    gateway = start_gateway(max_waiting=0)
    with gateway.client() as client:
        refused = acquire(client, wait_seconds=1)
        assert refused.status_code == 429
        assert int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"] == "queue_full"


def test_idempotency_key_returns_the_same_lease(pool: Pool, start_gateway: GatewayFactory) -> None:
    pool.add_sandboxes(3)
    with start_gateway().client() as client:
        first = acquire(client, idempotency_key="episode-42")
        retried = acquire(client, idempotency_key="episode-42")
        assert first.status_code == retried.status_code == 201
        assert retried.json()["leases"][0]["id"] == first.json()["leases"][0]["id"]
        assert len(pool.leases_on_pods()) == 1
        # The same key for a different request (another count) is refused, with what to do.
        other = acquire(client, idempotency_key="episode-42", count=2)
        assert other.status_code == 422, other.text
        assert other.json()["error"] == "idempotency_key_reused"
        assert "use a new key" in other.json()["detail"]
        assert len(pool.leases_on_pods()) == 1


def test_bulk_release_by_run(pool: Pool, start_gateway: GatewayFactory) -> None:
    pool.add_sandboxes(4)
    with start_gateway().client() as client:
        for run in ("a", "a", "b"):
            assert acquire(client, labels={"run": run}).status_code == 201
        released = client.post("/v1/runs/a/release").json()
        assert len(released["released"]) == 2
        states = Counter(pool.states().values())
        assert states == {api.LEASE_RELEASED: 2, api.LEASE_LEASED: 1, api.LEASE_FREE: 1}


def test_region_preference_is_honoured(pool: Pool, start_gateway: GatewayFactory) -> None:
    pool.add_sandboxes(6)
    with start_gateway().client() as client:
        lease = acquire(client, regions=["asia-southeast1"]).json()["leases"][0]
        assert lease["region"] == "asia-southeast1"


def test_bad_requests_get_clear_errors(pool: Pool, start_gateway: GatewayFactory) -> None:
    gateway = start_gateway()
    with gateway.client() as client:
        unknown = acquire(client, pool="nope")
        assert unknown.status_code == 404
        assert "no pool named 'nope'" in unknown.json()["detail"]
        invalid = client.post("/v1/leases", json={"pool": "python", "count": 0})
        assert invalid.status_code == 422
        assert "count" in invalid.json()["detail"]
        assert client.get("/v1/leases/default.nothing").status_code == 404
        assert client.post("/v1/leases", content=b"{not json").status_code == 422


def test_auth_static_tokens(pool: Pool, start_gateway: GatewayFactory) -> None:
    pool.add_sandboxes(1)
    gateway = start_gateway()
    with gateway.client(token=None) as anonymous:
        missing = acquire(anonymous)
        assert missing.status_code == 401
        assert missing.headers["WWW-Authenticate"] == "Bearer"
    with gateway.client(token="wrong") as stranger:
        assert acquire(stranger).status_code == 401
    with gateway.client(token="other-token") as other:
        forbidden = acquire(other)
        assert forbidden.status_code == 403
        assert "may not lease from pool 'python'" in forbidden.json()["detail"]
    with gateway.client() as owner:
        lease = acquire(owner).json()["leases"][0]
    with gateway.client(token="other-token") as other:
        assert other.get(f"/v1/leases/{lease['id']}").status_code == 403
        assert other.delete(f"/v1/leases/{lease['id']}").status_code == 403


def test_auth_with_a_gateway_audience_refuses_apiserver_tokens(
    pool: Pool, start_gateway: GatewayFactory, kube: Kubectl
) -> None:
    pool.add_sandboxes(1)
    kube("create", "serviceaccount", "actor")
    apiserver_token = kube("create", "token", "actor", "--duration=10m").strip()
    gateway_token = kube("create", "token", "actor", "--duration=10m", "--audience=sandfleet-gateway").strip()
    gateway = start_gateway(auth="kubernetes", audiences=("sandfleet-gateway",))
    with gateway.client(token=apiserver_token) as client:
        refused = acquire(client)
        assert refused.status_code == 401, refused.text
    # Minted for the gateway: authenticated (then refused by RBAC, which nothing granted here).
    with gateway.client(token=gateway_token) as client:
        assert acquire(client).status_code == 403


def test_auth_kubernetes_tokens_and_rbac(
    pool: Pool, start_gateway: GatewayFactory, kube: Kubectl, namespace: str
) -> None:
    pool.add_sandboxes(1)
    kube("create", "serviceaccount", "actor")
    token = kube("create", "token", "actor", "--duration=10m").strip()
    gateway = start_gateway(auth="kubernetes")
    with gateway.client(token=token) as client:
        denied = acquire(client)
        assert denied.status_code == 403
        assert "grant the verb `use` on sandboxpools/python" in denied.json()["detail"]
    # `use` is our own verb, so the Role is written out (kubectl create role only knows API verbs).
    kube.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "lease-python"},
            "rules": [
                {
                    "apiGroups": [api.GROUP],
                    "resources": [api.POOL_PLURAL],
                    "resourceNames": ["python"],
                    "verbs": ["use"],
                }
            ],
        }
    )
    kube(
        "create", "rolebinding", "actor-leases", "--role=lease-python",
        f"--serviceaccount={namespace}:actor",
    )  # fmt: skip
    # A fresh gateway: the first one cached the denial for its cache window.
    with start_gateway(auth="kubernetes").client(token=token) as client:
        granted = acquire(client)
        assert granted.status_code == 201, granted.text
        assert granted.json()["leases"][0]["holder"] == f"system:serviceaccount:{namespace}:actor"


def test_metrics_follow_the_product_names(pool: Pool, start_gateway: GatewayFactory) -> None:
    pool.add_sandboxes(1)
    gateway = start_gateway()
    with gateway.client() as client:
        assert acquire(client).status_code == 201
        text = client.get("/metrics").text
    assert 'sandfleet_lease_acquisitions_total{cluster="default",pool="python",result="warm_hit"} 1.0' in text
    assert "sandfleet_lease_wait_seconds_bucket" in text
    assert "sandfleet_leases_active 1.0" in text
    assert 'sandfleet_gateway_request_duration_seconds_count{method="POST",route="/v1/leases"}' in text
    assert "sandfleet_build_info" in text


def test_the_gateway_serves_its_informers_counters(pool: Pool, start_gateway: GatewayFactory) -> None:
    pool.add_sandboxes(1)
    with start_gateway().client() as client:
        assert acquire(client).status_code == 201
        # The claim is the first write of its shard's ledger: the watch sees the ledger created.
        added = 'sandfleet_kube_watch_events_total{resource="sandboxledgers",type="ADDED"}'
        wait_for(lambda: added in client.get("/metrics").text, what="the claim's watch event counted")
        text = client.get("/metrics").text
    for resource in ("pods", "sandboxpools", "sandboxledgers"):
        assert f'sandfleet_kube_relists_total{{reason="start",resource="{resource}"}} 1.0' in text
    assert 'sandfleet_ledger_writes_total{result="committed"} 1.0' in text


def test_prefetch_writes_a_prewarm_and_leases_by_image(pool: Pool, start_gateway: GatewayFactory) -> None:
    pool.add_sandboxes(2)
    task_pod = sandbox_pod("python-task-0000", "python", "us-east1", image="tasks/astropy:1")
    pool.kube.apply(task_pod)
    wait_for(lambda: pool.ready_count("task") == 1, what="the task-image sandbox")
    with start_gateway().client() as client:
        written = client.post(
            "/v1/prefetch",
            json={"pool": "python", "images": [{"image": "tasks/astropy:1", "count": 3}]},
        )
        assert written.status_code == 200, written.text
        (name,) = written.json()["prewarms"]
        spec = pool.kube.json("get", "sandboxprewarms", name)["spec"]
        expires_in = datetime.fromisoformat(spec.pop("expiresAt")).timestamp() - time.time()
        assert 590 < expires_in <= 600
        assert spec == {"pool": "python", "image": "tasks/astropy:1", "count": 3, "ttlSeconds": 600}
        by_image = client.post("/v1/leases", json={"image": "tasks/astropy:1"})
        assert by_image.status_code == 201, by_image.text
        assert by_image.json()["leases"][0]["sandbox"] == "python-task-0000"
        plain = acquire(client).json()["leases"][0]
        assert plain["sandbox"].startswith("python-sb-")
        unknown = client.post("/v1/leases", json={"image": "tasks/nothing:1"})
        assert unknown.status_code == 404
        assert "prefetch it" in unknown.json()["detail"]


def test_gateway_killed_mid_burst_loses_nothing_and_retries_find_their_leases(
    pool: Pool, start_gateway: GatewayFactory
) -> None:
    pool.add_sandboxes(80)
    doomed, survivor = start_gateway(), start_gateway()
    keys = [f"episode-{i}" for i in range(60)]

    async def burst_then_kill() -> list[httpx.Response | BaseException]:
        async with httpx.AsyncClient(
            base_url=doomed.url, headers={"Authorization": "Bearer actor-token"}, timeout=30
        ) as client:
            calls = [
                asyncio.create_task(
                    client.post("/v1/leases", json={"pool": "python", "idempotency_key": key})
                )
                for key in keys
            ]
            await asyncio.wait(calls, return_when=asyncio.FIRST_COMPLETED)
            doomed.kill()  # SIGKILL while the other claims are in flight
            return list(await asyncio.gather(*calls, return_exceptions=True))

    first_try = asyncio.run(burst_then_kill())
    answered = {
        key: r.json()["leases"][0]["id"]
        for key, r in zip(keys, first_try, strict=True)
        if isinstance(r, httpx.Response) and r.status_code == 201
    }
    assert answered, "the kill comes after the first answer"
    # Every caller retries through the surviving gateway with the same idempotency key, once the
    # survivor's watch has seen what the dead replica wrote (the key index is per replica and
    # eventually consistent: a retry inside that window may get a second sandbox, see
    # docs/gateway.md; that window is what a lease ledger closes).
    leased = len(pool.leases_on_pods())
    with survivor.client() as client:
        wait_for(
            lambda: len(client.get("/v1/leases").json()["leases"]) >= leased,
            "the survivor to see the dead replica's claims",
        )
        retried = {key: acquire(client, idempotency_key=key).json()["leases"][0]["id"] for key in keys}
    assert all(retried[key] == lease_id for key, lease_id in answered.items())
    on_pods = {lease["idempotency_key"]: lease["id"] for lease in pool.leases_on_pods().values()}
    assert on_pods == retried, "a lease was lost, duplicated, or granted twice for one key"


def test_callers_who_give_up_leave_no_lease_behind(pool: Pool, start_gateway: GatewayFactory) -> None:
    """Clients that time out on queued acquires (one single, one group) get nothing leased later."""
    gateway = start_gateway()
    for body in ({"idempotency_key": "gives-up"}, {"count": 2}):
        with gateway.client(timeout=1.0) as impatient, pytest.raises(httpx.ReadTimeout):
            acquire(impatient, wait_seconds=60, **body)
    with gateway.client() as client:

        def waiting() -> int:
            pools = client.get("/v1/pools").json()["pools"]
            return int(next(p for p in pools if p["name"] == "python")["waiting"])

        wait_for(lambda: waiting() == 0, "the abandoned acquires to leave the queue", timeout=10)
        names = pool.add_sandboxes(2)
        time.sleep(2)  # an abandoned waiter would have claimed them within milliseconds
        states, recorded = pool.states(), pool.leases_on_pods()
        for name in names:
            assert states[name] == api.LEASE_FREE
            assert name not in recorded
        granted = acquire(client, count=2, wait_seconds=5)
        assert granted.status_code == 201, granted.text
        assert sorted(lease["sandbox"] for lease in granted.json()["leases"]) == sorted(names)
