"""Idempotency keys: a retry gets the same leases (joined in flight, or adopted), never new ones."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from sandfleet.core import api
from sandfleet.core.leases import LeaseRecord
from sandfleet.gateway.lease_errors import KeyReused, WaitTimeout
from sandfleet.gateway.lease_requests import LeaseRequest
from sandfleet.gateway.leasing import LeaseService
from tests.support.backends import MemoryBackend, leased, request, warm


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


async def test_a_tenant_cannot_join_another_tenants_acquire_by_spelling_its_key() -> None:
    backend = MemoryBackend()
    service = LeaseService(backend)

    def request(holder: str, key: str) -> LeaseRequest:
        return LeaseRequest(pool="python", holder=holder, idempotency_key=key, wait_seconds=5)

    # Both wait in the queue: `alice/x` + `y` and `alice` + `x/y` once joined to the same string.
    victim = asyncio.ensure_future(service.acquire(request("alice/x", "y")))
    await asyncio.sleep(0.01)
    intruder = asyncio.ensure_future(service.acquire(request("alice", "x/y")))
    await asyncio.sleep(0.01)
    backend.add("s0")
    backend.add("s1")
    theirs, mine = await asyncio.gather(victim, intruder)
    assert [lease.holder for lease, _ in theirs.leases] == ["alice/x"]
    assert [lease.holder for lease, _ in mine.leases] == ["alice"]
    assert theirs.leases[0][0].id != mine.leases[0][0].id


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
