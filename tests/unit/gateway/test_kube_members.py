"""Gateway membership over the Lease heartbeat: a replica's own Lease, the peers it sees, the dead it forgets.

How a Lease is renewed is sandfleet.kube.heartbeat's (tests/unit/kube/test_heartbeat.py); these are
membership's own parts: the Lease's name and label, who counts as live, and leaving.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core import api
from sandfleet.core.coordination import renewal
from sandfleet.gateway.kube_members import GatewayMembers, lease_name
from tests.unit.kube.fake_leases import NAMESPACE, FakeLeases

DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MEMBER = {api.GATEWAY_MEMBER_LABEL: "true"}


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def until(condition: Callable[[], bool], within: float = 2.0) -> None:
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110 (a property over time, no event to wait on)
            await asyncio.sleep(0.001)


@given(st.text(max_size=300))
def test_every_identity_gets_a_valid_lease_name_of_its_own(identity: str) -> None:
    name = lease_name(identity)
    assert name.startswith("sandfleet-gateway-")
    assert DNS_1123.match(name)
    assert len(name) <= 253


def test_a_pod_name_is_its_lease_name_as_it_is() -> None:
    assert lease_name("gateway-7f9c-abcde") == "sandfleet-gateway-gateway-7f9c-abcde"
    assert lease_name("Host_1-42") == "sandfleet-gateway-host-1-42"


async def test_a_replica_renews_its_own_lease_shares_with_live_peers_and_forgets_the_dead() -> None:
    leases, clock = FakeLeases(), Clock(100.0)
    peer_spec = {
        "holderIdentity": "gw-b",
        "leaseDurationSeconds": 15,
        "renewTime": "2026-11-29T12:00:00.000000Z",
    }
    leases.put_lease("sandfleet-gateway-gw-b", peer_spec, labels=MEMBER)
    leases.put_lease("sandfleet-operator", {"holderIdentity": "op-a"})  # not a member: no label
    told: list[tuple[str, ...]] = []
    members = GatewayMembers(leases, NAMESPACE, "gw-a", told.append, renew_seconds=0.002, clock=clock)  # type: ignore[arg-type]
    await members.start()
    try:
        await until(lambda: members.members == ("gw-a", "gw-b"))
        await until(lambda: "sandfleet-gateway-gw-a" in leases.objects)
        mine = leases.objects["sandfleet-gateway-gw-a"]
        assert mine["metadata"]["labels"] == MEMBER
        assert mine["spec"] == {**renewal("gw-a", 15.0, 0.0), "renewTime": mine["spec"]["renewTime"]}
        assert told == [("gw-a", "gw-b")]

        clock.now += 15.5  # gw-b silent a whole duration: no longer shared with
        await until(lambda: members.members == ("gw-a",))
        assert told[-1] == ("gw-a",)
        assert "sandfleet-gateway-gw-b" in leases.objects, "kept until silent for two durations"
        clock.now += 15.0
        await until(lambda: "sandfleet-gateway-gw-b" not in leases.objects)
    finally:
        await members.stop()
    assert set(leases.objects) == {"sandfleet-operator"}, "leaving deletes its own Lease"


async def test_a_replica_that_cannot_renew_still_counts_itself_and_leaves_quietly() -> None:
    leases = FakeLeases()
    told: list[tuple[str, ...]] = []
    members = GatewayMembers(leases, NAMESPACE, "gw-a", told.append, renew_seconds=0.002)  # type: ignore[arg-type]
    leases.failing = OSError("connection refused")
    await members.start()
    await asyncio.sleep(0.02)
    assert members.members == ("gw-a",)
    assert told == []
    await members.stop()  # the failing delete is no error
    assert leases.objects == {}
