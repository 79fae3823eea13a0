"""The wait queues: first come first served, overtaking, all-or-nothing groups, batches, racing rivals.

Through the lease service, over an in-memory conditional store.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from sandfleet.core import api
from sandfleet.gateway.lease_errors import PoolQueueFull, WaitTimeout
from sandfleet.gateway.leasing import LeaseService
from tests.support.backends import MemoryBackend, leased, request, warm
from tests.unit.gateway.virtual_time import on_virtual_time


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


async def test_a_batch_returns_at_once_when_all_it_asks_for_are_warm() -> None:
    backend = MemoryBackend()
    warm(backend, 30)
    service = LeaseService(backend)
    started = time.monotonic()
    granted = await service.acquire(request(count=20, min_count=5, wait_seconds=10))
    assert time.monotonic() - started < 1
    assert len(granted.leases) == len({lease.id for lease, _ in granted.leases}) == 20
    assert leased(backend) == {lease.id for lease, _ in granted.leases}


@on_virtual_time
async def test_a_batch_short_of_its_count_returns_what_it_has_at_the_end_of_its_wait() -> None:
    backend = MemoryBackend()
    warm(backend, 12)
    loop = asyncio.get_running_loop()
    service = LeaseService(backend, clock=loop.time)
    started = loop.time()
    granted = await service.acquire(request(count=20, min_count=10, wait_seconds=0.3))
    # Virtual time: exact on any machine. It waited for more, then took what there was.
    assert loop.time() - started == pytest.approx(0.3)
    assert len(granted.leases) == 12
    assert leased(backend) == {lease.id for lease, _ in granted.leases}
    assert service.waiting("python") == 0


async def test_a_batch_collects_refills_and_returns_as_soon_as_it_is_full() -> None:
    backend = MemoryBackend()
    warm(backend, 2)
    service = LeaseService(backend)
    batch = asyncio.create_task(service.acquire(request(count=4, min_count=1, wait_seconds=5)))
    for name in ("r0", "r1"):
        await asyncio.sleep(0.03)
        backend.add(name)  # one refill at a time
    granted = await asyncio.wait_for(batch, 1)  # full: long before its 5 s
    assert sorted(lease.id for lease, _ in granted.leases) == ["ns.r0", "ns.r1", "ns.s0", "ns.s1"]


async def test_a_batch_below_its_minimum_at_the_deadline_gives_everything_back() -> None:
    backend = MemoryBackend()
    warm(backend, 3)
    service = LeaseService(backend)
    with pytest.raises(WaitTimeout) as timeout:
        await service.acquire(request(count=10, min_count=5, wait_seconds=0.2))
    assert timeout.value.position == 1
    await asyncio.sleep(0.05)  # the un-claims land
    assert leased(backend) == set()
    assert sorted(backend.unclaimed) == ["ns.s0", "ns.s1", "ns.s2"]


async def test_a_batch_with_no_wait_takes_what_is_warm_now() -> None:
    backend = MemoryBackend()
    warm(backend, 3)
    service = LeaseService(backend)
    granted = await service.acquire(request(count=10, min_count=1, wait_seconds=0))
    assert len(granted.leases) == 3


@on_virtual_time
async def test_a_single_behind_a_batch_waits_no_longer_than_the_overtaking_bound() -> None:
    # Virtual time, the service aging its waiters on the loop's clock: every sleep below is exact,
    # so the single is young when "early" comes and past the bound when "late" does, on any machine.
    backend = MemoryBackend()
    service = LeaseService(backend, clock=asyncio.get_running_loop().time, overtake_seconds=0.1)
    batch = asyncio.create_task(service.acquire(request(count=50, min_count=1, wait_seconds=1)))
    await asyncio.sleep(0.01)
    single = asyncio.create_task(service.acquire(request(wait_seconds=1)))
    await asyncio.sleep(0.02)
    backend.add("early")  # the single is young: the batch takes it
    await asyncio.sleep(0.15)
    backend.add("late")  # the single has waited the bound: it goes first
    got = await asyncio.wait_for(single, 1)
    assert got.leases[0][0].id == "ns.late"
    assert got.position == 1  # it arrived behind the batch
    granted = await asyncio.wait_for(batch, 2)
    assert [lease.id for lease, _ in granted.leases] == ["ns.early"]


async def test_an_old_group_behind_a_batch_collects_before_it() -> None:
    backend = MemoryBackend()
    service = LeaseService(backend, overtake_seconds=0.05)
    batch = asyncio.create_task(service.acquire(request(count=50, min_count=1, wait_seconds=0.6)))
    await asyncio.sleep(0.01)
    group = asyncio.create_task(service.acquire(request(count=2, wait_seconds=1)))
    await asyncio.sleep(0.1)
    for name in ("s0", "s1", "s2"):
        backend.add(name)  # refills, one claim's round trip apart
        await asyncio.sleep(0.02)
    got = await asyncio.wait_for(group, 1)
    assert len(got.leases) == 2
    granted = await asyncio.wait_for(batch, 1)
    assert len(granted.leases) == 1
    assert {lease.id for lease, _ in got.leases}.isdisjoint(lease.id for lease, _ in granted.leases)


async def test_concurrent_batches_never_lease_a_sandbox_twice_under_racing_rivals() -> None:
    backend = MemoryBackend(steal_probability=0.2, seed=3)
    warm(backend, 80)
    service = LeaseService(backend)
    results = await asyncio.gather(
        *(service.acquire(request(count=30, min_count=5, wait_seconds=0.3)) for _ in range(4)),
        return_exceptions=True,
    )
    granted = [lease.id for r in results if not isinstance(r, BaseException) for lease, _ in r.leases]
    assert len(granted) == len(set(granted))
    assert not set(granted) & backend.stolen
    assert len(granted) + len(backend.stolen) == 80  # all of the pool went to someone
    assert leased(backend) - backend.stolen == set(granted)


async def test_a_caller_who_leaves_a_batch_leaves_no_lease_behind() -> None:
    backend = MemoryBackend()
    warm(backend, 3)
    service = LeaseService(backend)
    batch = asyncio.create_task(service.acquire(request(count=10, min_count=1, wait_seconds=5)))
    await asyncio.sleep(0.05)
    assert len(leased(backend)) == 3  # claimed for it, held while it waits for more
    batch.cancel()
    await asyncio.gather(batch, return_exceptions=True)
    await asyncio.sleep(0.05)
    assert leased(backend) == set()
    assert service.waiting("python") == 0
