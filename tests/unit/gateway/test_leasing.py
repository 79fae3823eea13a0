"""The lease service's queue, races and all-or-nothing groups, over an in-memory conditional store."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from sandfleet.core import api
from sandfleet.core.leases import LeaseError, LeaseRecord
from sandfleet.core.model import SandboxPod
from sandfleet.core.quotas import CapacityError, QuotaExceeded, Quotas
from sandfleet.gateway.leasing import (
    RENEW_ATTEMPTS,
    LeaseGone,
    LeaseService,
    NotTheHolder,
    PoolQueueFull,
    UnknownName,
    WaitTimeout,
)
from tests.support.backends import POOL, MemoryBackend, request


async def test_racing_claims_never_lease_a_sandbox_twice() -> None:
    backend = MemoryBackend(steal_probability=0.3, seed=7)
    for i in range(60):
        backend.add(f"s{i}")
    service = LeaseService(backend)
    results = await asyncio.gather(
        *(service.acquire(request(wait_seconds=0.5)) for _ in range(80)), return_exceptions=True
    )
    granted = [lease for r in results if not isinstance(r, BaseException) for lease, _ in r.leases]
    assert len({lease.id for lease in granted}) == len(granted)
    assert not {lease.id for lease in granted} & backend.stolen
    assert len(granted) + len(backend.stolen) == 60
    assert all(isinstance(r, WaitTimeout) for r in results if isinstance(r, BaseException))


async def test_waiters_are_served_first_come_first_served() -> None:
    backend = MemoryBackend()
    service = LeaseService(backend)
    waiters = []
    for episode in range(3):
        waiters.append(asyncio.create_task(service.acquire(request(labels={"e": str(episode)}))))
        await asyncio.sleep(0.01)
    assert service.waiting("python") == 3
    for i in range(3):
        backend.add(f"s{i}")
        await asyncio.sleep(0.01)
    results = await asyncio.gather(*waiters)
    served = [r.leases[0][0] for r in results]
    assert [lease.id for lease in served] == ["ns.s0", "ns.s1", "ns.s2"]
    assert [r.position for r in results] == [0, 1, 2]


async def test_a_single_overtakes_a_group_that_cannot_be_served_yet() -> None:
    backend = MemoryBackend()
    backend.add("s0")
    service = LeaseService(backend, overtake_seconds=60)
    group = asyncio.create_task(service.acquire(request(count=3, wait_seconds=0.3)))
    await asyncio.sleep(0.01)
    single = await asyncio.wait_for(service.acquire(request(wait_seconds=0.1)), 1)
    assert single.leases[0][0].id == "ns.s0"
    assert single.position == 1  # it arrived behind the group, and was served past it
    with pytest.raises(WaitTimeout):
        await group


async def test_a_group_that_waited_long_enough_is_not_overtaken_and_stays_all_or_nothing() -> None:
    backend = MemoryBackend()
    service = LeaseService(backend, overtake_seconds=0.05)
    group = asyncio.create_task(service.acquire(request(count=3, wait_seconds=0.4)))
    await asyncio.sleep(0.1)  # past the overtaking bound
    single = asyncio.create_task(service.acquire(request(wait_seconds=0.2)))
    await asyncio.sleep(0.01)
    backend.add("s0")  # goes to the group (a partial claim it keeps), not to the single
    with pytest.raises(WaitTimeout):
        await single
    assert backend.items["ns.s0"].state == api.LEASE_LEASED
    with pytest.raises(WaitTimeout):
        await group
    await asyncio.sleep(0.05)
    assert backend.items["ns.s0"].state == api.LEASE_FREE  # all or nothing: given back


async def test_a_group_collects_refills_until_whole() -> None:
    backend = MemoryBackend()
    service = LeaseService(backend, overtake_seconds=0)
    group = asyncio.create_task(service.acquire(request(count=3, wait_seconds=2)))
    for name in ("s0", "s1", "s2"):
        await asyncio.sleep(0.02)
        backend.add(name)  # one refill at a time: never three warm at once
    granted = await asyncio.wait_for(group, 1)
    assert sorted(lease.id for lease, _ in granted.leases) == ["ns.s0", "ns.s1", "ns.s2"]


async def test_queue_full_and_preferred_region() -> None:
    backend = MemoryBackend()
    backend.add("a", "us-east1")
    backend.add("b", "europe-west4")
    service = LeaseService(backend, max_waiting=0)
    granted = await service.acquire(request(regions=("europe-west4",)))
    assert granted.leases[0][1].region == "europe-west4"
    await service.acquire(request())
    with pytest.raises(PoolQueueFull):
        await service.acquire(request())


async def test_leases_by_image_take_only_that_image() -> None:
    backend = MemoryBackend()
    backend.add("plain")
    backend.add("task", image="task:1")
    service = LeaseService(backend)
    by_image = await service.acquire(request(image="task:1"))
    assert by_image.leases[0][0].id == "ns.task"
    with pytest.raises(WaitTimeout):
        await service.acquire(request(image="task:1", wait_seconds=0.05))
    assert (await service.acquire(request())).leases[0][0].id == "ns.plain"


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


async def test_idempotency_key_gives_the_same_lease_to_concurrent_retries() -> None:
    backend = MemoryBackend()
    for i in range(3):
        backend.add(f"s{i}")
    service = LeaseService(backend)
    a, b = await asyncio.gather(
        service.acquire(request(idempotency_key="k")), service.acquire(request(idempotency_key="k"))
    )
    later = await service.acquire(request(idempotency_key="k"))
    assert a.leases[0][0].id == b.leases[0][0].id == later.leases[0][0].id
    assert sum(s.state == api.LEASE_LEASED for s in backend.items.values()) == 1


async def test_a_tenant_holds_at_most_its_lease_quota_counting_what_it_waits_for() -> None:
    backend = MemoryBackend()
    for name in ("s0", "s1", "s2", "s3"):
        backend.add(name)
    service = LeaseService(backend, quotas=Quotas(max_leases_per_tenant=2))
    first = await service.acquire(request())
    waiting = asyncio.create_task(service.acquire(request(image="other", wait_seconds=1)))
    await asyncio.sleep(0.01)
    with pytest.raises(QuotaExceeded, match="holds 1 leases and is acquiring 1"):
        await service.acquire(request())  # one held, one waited for: the quota of 2 is spent
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    second = await service.acquire(request())
    other = await service.acquire(replace(request(), holder="bob"))  # quotas are per tenant
    assert other.leases
    await service.release(first.leases[0][0].id, "actor")  # released: room again
    await service.acquire(request())
    assert {lease.id for lease, _ in second.leases}.isdisjoint(lease.id for lease, _ in first.leases)


async def test_a_group_the_pool_can_never_hold_is_refused_at_once() -> None:
    backend = MemoryBackend()
    small = replace(POOL, max_sandboxes=4)
    backend.pool = lambda name: small if name == "python" else None  # type: ignore[method-assign]
    service = LeaseService(backend)
    with pytest.raises(CapacityError, match="holds at most 4"):
        await asyncio.wait_for(service.acquire(request(count=5, wait_seconds=30)), 0.5)
    assert service.waiting("python") == 0


async def test_a_group_passed_over_while_young_collects_once_due_without_any_change() -> None:
    backend = MemoryBackend()
    backend.add("s0")
    backend.add("s1")
    service = LeaseService(backend, overtake_seconds=0.1)
    group = asyncio.create_task(service.acquire(request(count=3, wait_seconds=2)))
    await asyncio.sleep(0.02)
    assert backend.items["ns.s0"].state == api.LEASE_FREE  # young: overtakable, it took nothing
    await asyncio.sleep(0.2)  # due, though no sandbox changed: it has collected both
    assert {backend.items[k].state for k in ("ns.s0", "ns.s1")} == {api.LEASE_LEASED}
    backend.add("s2")
    granted = await asyncio.wait_for(group, 1)
    assert len(granted.leases) == 3


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
