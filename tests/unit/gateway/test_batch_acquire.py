"""Batch acquires in the lease service (up to `count`, at least `min_count`, within the wait), in memory."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from sandfleet.core import api
from sandfleet.core.leases import LeaseRecord
from sandfleet.core.quotas import CapacityError, QuotaExceeded, Quotas
from sandfleet.gateway.leasing import KeyReused, LeaseService, WaitTimeout
from tests.support.backends import POOL, MemoryBackend, request
from tests.unit.gateway.virtual_time import on_virtual_time


def warm(backend: MemoryBackend, count: int, prefix: str = "s") -> None:
    for i in range(count):
        backend.add(f"{prefix}{i}")


def leased(backend: MemoryBackend) -> set[str]:
    return {key for key, s in backend.items.items() if s.state == api.LEASE_LEASED}


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


async def test_an_idempotency_key_covers_the_whole_batch() -> None:
    backend = MemoryBackend()
    warm(backend, 8)
    service = LeaseService(backend)
    ask = request(count=10, min_count=2, wait_seconds=0.1, idempotency_key="step-1")
    first, retry = await asyncio.gather(service.acquire(ask), service.acquire(ask))
    later = await service.acquire(ask)
    ids = sorted(lease.id for lease, _ in first.leases)
    assert len(ids) == 8
    assert sorted(lease.id for lease, _ in retry.leases) == ids
    assert sorted(lease.id for lease, _ in later.leases) == ids
    assert len(leased(backend)) == 8


async def test_a_batch_counts_its_count_against_the_lease_quota_and_above_it_is_refused() -> None:
    backend = MemoryBackend()
    warm(backend, 10)
    service = LeaseService(backend, quotas=Quotas(max_leases_per_tenant=5))
    with pytest.raises(CapacityError, match="lease quota of 5") as error:
        await service.acquire(request(count=6, min_count=1))
    assert error.value.code == "batch_too_large"
    await service.acquire(request(count=2))
    with pytest.raises(QuotaExceeded, match="holds 2 leases"):
        await service.acquire(request(count=4, min_count=1))  # 2 + up to 4 > 5, however few it gets


async def test_a_batch_above_the_batch_quota_or_whose_minimum_cannot_fit_the_pool_is_refused() -> None:
    backend = MemoryBackend()
    small = replace(POOL, max_sandboxes=4)
    backend.pool = lambda name: small if name == "python" else None  # type: ignore[method-assign]
    service = LeaseService(backend, quotas=Quotas(max_batch_size=100))
    with pytest.raises(CapacityError, match="SANDFLEET_GATEWAY_MAX_BATCH_SIZE"):
        await service.acquire(request(count=101, min_count=1))
    with pytest.raises(CapacityError, match="min_count to at most 4"):
        await asyncio.wait_for(service.acquire(request(count=10, min_count=5, wait_seconds=30)), 0.5)
    warm(backend, 2)
    granted = await service.acquire(request(count=10, min_count=1, wait_seconds=0.05))
    assert len(granted.leases) == 2  # up to 10 from a pool of 4 is fine: it takes what it gets


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


def claimed_by_a_dead_replica(backend: MemoryBackend, count: int, key: str) -> set[str]:
    """Sandboxes leased under `key` by a first attempt whose replica died before answering."""
    now = time.time()
    for i in range(count):
        backend.add(f"dead{i}")
    ids = set()
    for sandbox in [s for s in backend.items.values() if s.name.startswith("dead")]:
        lease = LeaseRecord(sandbox.key, "python", "actor", now, now + 60, 60, idempotency_key=key)
        backend.items.put(replace(sandbox, state=api.LEASE_LEASED, lease=lease))
        ids.add(sandbox.key)
    return ids


async def test_a_retry_that_finds_fewer_than_its_minimum_keeps_them_and_claims_the_rest() -> None:
    # Found in the fault suite: the retry was answered with the 27 claims it found, below its 150.
    backend = MemoryBackend()
    dead = claimed_by_a_dead_replica(backend, 3, "step-1")
    warm(backend, 20)
    service = LeaseService(backend)
    granted = await service.acquire(request(count=10, min_count=6, wait_seconds=1, idempotency_key="step-1"))
    ids = {lease.id for lease, _ in granted.leases}
    assert len(ids) == len(granted.leases) == 10
    assert dead <= ids  # what the first attempt claimed is kept, not stranded
    assert all(lease.idempotency_key == "step-1" for lease, _ in granted.leases)
    again = await service.acquire(request(count=10, min_count=6, wait_seconds=1, idempotency_key="step-1"))
    assert {lease.id for lease, _ in again.leases} == ids  # and a later retry gets the same ten


async def test_a_retry_at_or_above_its_minimum_gets_what_it_found_and_nothing_more() -> None:
    backend = MemoryBackend()
    dead = claimed_by_a_dead_replica(backend, 6, "step-1")
    warm(backend, 20)
    service = LeaseService(backend)
    granted = await service.acquire(request(count=10, min_count=6, wait_seconds=1, idempotency_key="step-1"))
    assert {lease.id for lease, _ in granted.leases} == dead
    assert leased(backend) == dead


async def test_a_short_retry_gives_back_what_it_claimed_and_keeps_what_it_found() -> None:
    backend = MemoryBackend()
    found = claimed_by_a_dead_replica(backend, 2, "group-1")
    warm(backend, 1)
    service = LeaseService(backend)
    with pytest.raises(WaitTimeout):  # a group of 5: 2 found, 1 warm, never whole
        await service.acquire(request(count=5, wait_seconds=0.1, idempotency_key="group-1"))
    await asyncio.sleep(0.05)
    # What it claimed went back warm; what it found may be what is left of an answer its caller
    # holds (and released part of), so it stays leased until its TTL, never freed from under it.
    assert leased(backend) == found


class LaggingReplica(MemoryBackend):
    """Another replica's view of `truth`, its watch behind: it has not seen some claims yet."""

    def __init__(self, truth: MemoryBackend, unseen: set[str]) -> None:
        super().__init__()
        self.truth = truth
        self.version = truth.version
        self.refreshed = 0
        for key, sandbox in truth.items.items():
            seen = sandbox if key not in unseen else replace(sandbox, state=api.LEASE_FREE, lease=None)
            self.items.put(seen)

    async def refresh_keyed(self, holder: str, idempotency_key: str, pool: str) -> None:
        self.refreshed += 1
        for sandbox in self.truth.leased_with_key(holder, idempotency_key):
            self.items.put(sandbox)


async def test_a_retry_at_a_replica_whose_watch_lags_gets_the_whole_answer() -> None:
    # Found in the fault suite (the apiserver stopped mid-batch): a retry answered from a watch
    # that had seen 85 of an answer's 115 leases answered with those 85.
    first = MemoryBackend()
    warm(first, 20)
    granted = await LeaseService(first).acquire(request(count=10, min_count=6, idempotency_key="step-1"))
    ids = sorted(lease.id for lease, _ in granted.leases)
    assert len(ids) == 10
    other = LaggingReplica(first, unseen=set(ids[:3]))
    again = await LeaseService(other).acquire(request(count=10, min_count=6, idempotency_key="step-1"))
    assert sorted(lease.id for lease, _ in again.leases) == ids
    assert other.refreshed == 1


async def test_a_key_in_use_for_another_request_is_refused_and_changes_nothing() -> None:
    # Count 1 under a key, then count 2 under it: the second is refused, and it must not free the
    # one lease the holder was answered with (a sequence test_lease_state_machine.py can draw).
    backend = MemoryBackend()
    warm(backend, 3)
    service = LeaseService(backend)
    first = await service.acquire(request(count=1, idempotency_key="k1"))
    held = {lease.id: lease for lease, _ in first.leases}
    with pytest.raises(KeyReused, match="in use for a different request"):
        await service.acquire(request(count=2, idempotency_key="k1"))
    assert leased(backend) == set(held)
    assert {s.key: s.lease for s in backend.items.values() if s.lease} == held  # not even renewed
    again = await service.acquire(request(count=1, idempotency_key="k1"))
    assert {lease.id for lease, _ in again.leases} == set(held)


async def test_another_request_cannot_join_one_in_flight_under_its_key() -> None:
    backend = MemoryBackend()
    service = LeaseService(backend)
    waiting = asyncio.create_task(service.acquire(request(count=2, wait_seconds=5, idempotency_key="k1")))
    await asyncio.sleep(0.02)
    with pytest.raises(KeyReused):
        await service.acquire(request(count=3, wait_seconds=5, idempotency_key="k1"))
    warm(backend, 2)
    assert len((await asyncio.wait_for(waiting, 2)).leases) == 2


async def test_a_key_is_free_again_once_its_leases_have_ended() -> None:
    backend = MemoryBackend()
    warm(backend, 3)
    service = LeaseService(backend)
    first = await service.acquire(request(count=1, idempotency_key="k1"))
    assert await service.release(first.leases[0][0].id, first.leases[0][0].holder)
    second = await service.acquire(request(count=2, idempotency_key="k1"))
    assert len(second.leases) == 2


async def test_a_key_the_client_made_for_this_try_skips_the_read_back_and_a_retry_does_not() -> None:
    """The client's first try of a key it made has no earlier attempt: nothing to read back."""
    first = MemoryBackend()
    warm(first, 4)
    other = LaggingReplica(first, unseen=set())
    service = LeaseService(other)
    await service.acquire(replace(request(idempotency_key="fresh-1"), fresh_key=True))
    assert other.refreshed == 0
    await service.acquire(request(idempotency_key="given-by-the-caller"))
    assert other.refreshed == 1  # a key the caller chose, or a retry: always read back
