"""Idempotency keys across tenants: `alice/x` with key `y` and `alice` with key `x/y` are two requests.

Against a real `sandfleet serve --local` (real gVisor): both wait for the same refill, so a shared
slot would hand the second tenant the first tenant's lease.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from tests.support.tenants import TenantGateway, tenant_gateway

pytestmark = pytest.mark.gvisor
__all__ = ["tenant_gateway"]


def drain(client: httpx.Client) -> list[str]:
    """Lease every warm sandbox (so the next acquire waits for a refill); their ids."""
    taken: list[str] = []
    while True:
        response = client.post("/v1/leases", json={"pool": "python", "wait_seconds": 0})
        if response.status_code != 201:
            assert response.status_code in (429, 504), response.text
            return taken
        taken += [lease["id"] for lease in response.json()["leases"]]


def acquire(results: dict[str, Any], name: str, client: httpx.Client, key: str) -> None:
    body = {"pool": "python", "idempotency_key": key, "wait_seconds": 60}
    results[f"{name} sent"] = time.monotonic()
    results[name] = client.post("/v1/leases", json=body)


def test_two_tenants_whose_holder_and_key_join_alike_get_their_own_leases(
    tenant_gateway: TenantGateway,
) -> None:
    with (
        tenant_gateway.client("alice/x") as victim,
        tenant_gateway.client("alice") as intruder,
        tenant_gateway.client("bob") as bob,
    ):
        for _ in range(5):  # a refill faster than the intruder's request proves nothing: try again
            held = drain(bob)
            results: dict[str, Any] = {}

            first = threading.Thread(target=acquire, args=(results, "victim", victim, "y"))
            first.start()
            time.sleep(0.02)
            acquire(results, "intruder", intruder, "x/y")
            first.join()
            for lease_id in held:
                bob.delete(f"/v1/leases/{lease_id}")
            theirs, mine = results["victim"], results["intruder"]
            assert theirs.status_code == 201, theirs.text
            assert mine.status_code == 201, mine.text
            their_lease, my_lease = theirs.json()["leases"][0], mine.json()["leases"][0]
            victim.delete(f"/v1/leases/{their_lease['id']}")
            intruder.delete(f"/v1/leases/{my_lease['id']}")
            assert my_lease["holder"] == "alice", my_lease
            assert my_lease["id"] != their_lease["id"]
            # The case that matters: one was still waiting when the other asked (the first sent's
            # wait, as the gateway timed it, outlasted the gap between the two, with a margin).
            (first_sent, first_wait), (second_sent, _) = sorted(
                (results[f"{name} sent"], answer.json()["timings"]["total_ms"] / 1000)
                for name, answer in (("victim", theirs), ("intruder", mine))
            )
            if second_sent + 0.05 < first_sent + first_wait:
                return
        pytest.fail("the pool refilled before the second request every time: nothing was tested")
