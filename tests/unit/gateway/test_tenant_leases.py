"""Each tenant's lease quota counts what it holds and what it waits for, and only its own."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from sandfleet.core.quotas import CapacityError, QuotaExceeded, Quotas
from sandfleet.gateway.leasing import LeaseService
from tests.support.backends import MemoryBackend, request, warm


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
