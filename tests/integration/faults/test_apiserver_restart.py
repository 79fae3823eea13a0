"""The apiserver restarts under load: gateways answer 503 with Retry-After while it is gone and
recover on their own (same processes), leases held across the outage go on.

Bounded: about 40 s (8 s without an apiserver, its restart, recovery, every sandbox leasable).
"""

from __future__ import annotations

import time
from functools import partial

import httpx
import pytest

from tests.integration.faults.conftest import POOL, TARGET, TOKEN, FaultCluster, Run
from tests.support.kube import wait_until

pytestmark = pytest.mark.cluster

OUTAGE_SECONDS = 8.0
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def _readyz_is(http: httpx.Client, url: str, status: int) -> bool:
    return http.get(f"{url}/readyz").status_code == status


def _outage(run: Run, cluster: FaultCluster, urls: list[str]) -> list[httpx.Response]:
    """Stop the apiserver, ask every gateway for a lease while it is gone, start it again."""
    apiserver = cluster.daemon("kube-apiserver")
    run.mark("stopping the apiserver")
    stopped_at = time.time()
    apiserver.stop()
    down_at = time.monotonic()
    answers = []
    try:
        with httpx.Client(headers=HEADERS, timeout=30) as http:
            for url in urls:
                wait_until(partial(_readyz_is, http, url, 503), 15, f"{url} not ready")
                body = {"pool": POOL, "wait_seconds": 5, "labels": {"run": "probe"}}
                answers.append(http.post(f"{url}/v1/leases", json=body))
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - down_at)))
    finally:
        run.mark("starting the apiserver")
        apiserver.start()
        wait_until(cluster.apiserver_ready, 90, "the apiserver to be back", 0.5)
        run.outages.append((stopped_at, time.time()))
        run.mark("the apiserver is back")
    return answers


def test_apiserver_restart_is_503_with_retry_after_then_recovery(steady: Run) -> None:
    fleet = steady.fleet
    pids = [g.process.pid for g in fleet.gateways if g.process]
    (held,) = steady.load.hold(1, ttl_seconds=60)
    wait_until(lambda: sum(c.ok for c in held.calls) >= 3, 20, "the holder to use its sandbox")

    answers = _outage(steady, fleet.cluster, fleet.urls)
    for answer in answers:
        assert answer.status_code == 503, answer.text
        assert int(answer.headers["Retry-After"]) >= 1
        assert answer.json()["error"] == "unavailable"

    with httpx.Client(headers=HEADERS, timeout=60) as http:
        for url in fleet.urls:
            wait_until(partial(_readyz_is, http, url, 200), 30, f"{url} ready again")
        steady.mark("both gateways ready again")
        steady.load.pause_workers()
        fleet.wait_at_target()
        steady.mark("the pool at its target")
        # Every warm sandbox is leasable through every gateway: none stays shunned after the outage.
        for url in fleet.urls:
            body = {"pool": POOL, "count": TARGET, "wait_seconds": 30, "labels": {"run": "probe"}}
            group = http.post(f"{url}/v1/leases", json=body)
            assert group.status_code == 201, f"{url}: {group.text}"
            for lease in group.json()["leases"]:
                assert http.delete(f"{url}/v1/leases/{lease['id']}").status_code == 200
    steady.mark("every warm sandbox leased through each gateway")
    assert [g.process.pid for g in fleet.gateways if g.process] == pids, "a gateway had to restart"
    assert held.first_lease_error is None, "a lease held across the outage was lost"
    steady.load.release_holders()
    steady.finish()
