"""Gateway replicas find each other through their Leases and hand out disjoint shares of the warm Pods."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
import pytest

from sandfleet.core import api
from sandfleet.core.ledger import shard_for
from sandfleet.core.partition import owner, shard_owner
from tests.integration.gateway.conftest import SPREAD, STORES, Gateway, GatewayFactory, Pool, wait_for

pytestmark = pytest.mark.cluster


def members(pool: Pool) -> set[str]:
    leases = pool.kube.json("get", "leases", "-l", api.GATEWAY_MEMBER_LABEL)["items"]
    return {str(lease["spec"]["holderIdentity"]) for lease in leases}


def replicas(gateway: Gateway) -> float:
    """What the gateway's own metric says: the replicas it shares the warm Pods with."""
    text = httpx.get(f"{gateway.url}/metrics").text
    (line,) = (line for line in text.splitlines() if line.startswith("sandfleet_gateway_replicas "))
    return float(line.split()[1])


def identity(gateway: Gateway) -> str:
    return f"{socket.gethostname()}-{gateway.process.pid}"  # gateway.kube_members.default_identity


async def burst(gateways: list[Gateway], per_gateway: int) -> list[list[dict[str, Any]]]:
    """`per_gateway` concurrent acquires at every gateway at once; each gateway's grants."""

    async def through(gateway: Gateway) -> list[dict[str, Any]]:
        headers = {"Authorization": "Bearer actor-token"}
        async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=60) as client:
            calls = [
                client.post("/v1/leases", json={"pool": "python", "wait_seconds": 20})
                for _ in range(per_gateway)
            ]
            responses = await asyncio.gather(*calls)
        assert all(r.status_code == 201 for r in responses), [
            r.text for r in responses if r.status_code != 201
        ]
        return [r.json()["leases"][0] for r in responses]

    return list(await asyncio.gather(*(through(g) for g in gateways)))


def first_owner(pool: Pool, sandbox: str, members: list[str]) -> str | None:
    """Whose share a sandbox is in: its ledger shard's owner, or (Pods with their own lease) its name's."""
    if pool.store == api.STORE_LEDGER:
        return shard_owner(shard_for(sandbox, pool.name, SPREAD), members)
    return owner(sandbox, members)


@STORES
def test_three_replicas_take_their_own_shares_first_and_leave_cleanly(
    pool: Pool, start_gateway: GatewayFactory
) -> None:
    pool.add_sandboxes(180)
    wait_for(lambda: pool.ready_count("sb") == 180, "180 warm sandbox Pods")
    gateways = [start_gateway() for _ in range(3)]
    names = {identity(g) for g in gateways}
    wait_for(lambda: members(pool) == names, "each replica's membership Lease")
    # Each replica sees the others through its own watch: a renewal (5 s) later at most.
    wait_for(
        lambda: all(replicas(g) == 3 for g in gateways), "every replica to see the other two", timeout=20
    )

    grants = asyncio.run(burst(gateways, 30))
    sandboxes = [lease["sandbox"] for granted in grants for lease in granted]
    assert len(sandboxes) == len(set(sandboxes)) == 90, "no sandbox leased twice"
    for gateway, granted in zip(gateways, grants, strict=True):
        own = sum(
            first_owner(pool, lease["sandbox"], sorted(names)) == identity(gateway) for lease in granted
        )
        # About 60 of the 180 are each replica's own, so 30 can all come from its share.
        assert own == len(granted), (
            f"{identity(gateway)} took {len(granted) - own} of another replica's share"
        )
    on_pods = pool.leases_on_pods()
    assert {lease["sandbox"] for granted in grants for lease in granted} == set(on_pods)

    gateways[0].process.terminate()
    gateways[0].process.wait(timeout=10)
    wait_for(lambda: members(pool) == names - {identity(gateways[0])}, "the stopped replica's Lease to go")
    wait_for(lambda: all(replicas(g) == 2 for g in gateways[1:]), "the others to share without it")
