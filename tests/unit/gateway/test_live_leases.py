"""A granted lease's life: read by its holder only, renewed against rival writers, released, ended."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sandfleet.core.leases import LeaseError, LeaseRecord
from sandfleet.core.model import SandboxPod
from sandfleet.gateway.lease_errors import LeaseGone, NotTheHolder, UnknownName
from sandfleet.gateway.leasing import LeaseService
from sandfleet.gateway.live_leases import RENEW_ATTEMPTS
from tests.support.backends import MemoryBackend, request


async def test_expired_and_released_leases_are_gone() -> None:
    backend = MemoryBackend()
    backend.add("s0")
    backend.add("s1")
    clock = [1000.0]
    service = LeaseService(backend, clock=lambda: clock[0])
    ((first, _),) = (await service.acquire(request(ttl_seconds=10))).leases
    ((second, _),) = (await service.acquire(request())).leases
    clock[0] += 11
    with pytest.raises(LeaseGone, match="expired"):
        await service.current(first.id)
    assert await service.release(second.id, "actor") is True
    assert await service.release(second.id, "actor") is False
    with pytest.raises(LeaseGone, match="released"):
        await service.current(second.id)


async def test_a_recycled_sandbox_s_lease_names_its_episode_and_an_ended_episode_s_id_is_gone() -> None:
    backend = MemoryBackend()
    backend.add("s0")
    backend.items.put(replace(backend.items["ns.s0"], episodes=2))  # reset twice since it was made
    service = LeaseService(backend)
    ((lease, _),) = (await service.acquire(request())).leases
    assert lease.id == "ns.s0~2"
    assert (await service.current(lease.id, "actor"))[0] == lease
    for ended in ("ns.s0", "ns.s0~1"):
        with pytest.raises(LeaseGone, match="reset for another episode"):
            await service.current(ended, "actor")
        with pytest.raises(UnknownName):  # another tenant learns nothing of it
            await service.current(ended, "intruder")


class LostBackend(MemoryBackend):
    """A backend whose every lease is lost with its cluster, held by `alice` (as a fleet's member)."""

    async def fresh(self, lease_id: str) -> None:
        gone = LeaseGone(f"lease {lease_id!r} is on a member cluster the gateway cannot reach")
        gone.holder = "alice" if lease_id.startswith("known") else None
        raise gone


async def test_only_the_holder_hears_that_a_lease_was_lost_with_its_cluster() -> None:
    service = LeaseService(LostBackend())
    with pytest.raises(LeaseGone, match="cannot reach"):
        await service.current("known.lease~1", "alice")
    with pytest.raises(NotTheHolder):
        await service.current("known.lease~1", "mallory")
    with pytest.raises(UnknownName):
        await service.current("unknown.lease~1", "mallory")


class ContendedBackend(MemoryBackend):
    """A backend whose next `losses` lease writes each lose to another writer."""

    def __init__(self, losses: int) -> None:
        super().__init__()
        self.losses = losses
        self.calls: list[str] = []

    async def write_lease(self, sandbox: SandboxPod, lease: LeaseRecord) -> SandboxPod | None:
        self.calls.append("write")
        if self.losses > 0:
            self.losses -= 1
            return None
        return await super().write_lease(sandbox, lease)

    async def fresh(self, lease_id: str) -> SandboxPod | None:
        self.calls.append("read")
        return await super().fresh(lease_id)


async def test_a_renewal_that_loses_its_write_reads_the_lease_again_and_writes_again() -> None:
    backend = ContendedBackend(losses=0)
    backend.add("s0")
    service = LeaseService(backend)
    lease = (await service.acquire(request())).leases[0][0]
    backend.losses = 2
    renewed = await service.renew(lease.id, "actor", 120)
    assert backend.calls == ["write", "read", "write", "read", "write"]
    assert renewed.ttl_seconds == 120
    assert backend.items["ns.s0"].lease == renewed

    backend.calls.clear()
    backend.losses = RENEW_ATTEMPTS
    with pytest.raises(LeaseError, match="is being changed by someone else; retry"):
        await service.renew(lease.id, "actor", 120)
    assert backend.calls == ["write", "read"] * RENEW_ATTEMPTS
    assert RENEW_ATTEMPTS == 5
