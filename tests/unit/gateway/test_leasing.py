"""The lease service's checks of an acquire against its pool, before it waits for anything."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from sandfleet.core.quotas import CapacityError, Quotas
from sandfleet.gateway.leasing import LeaseService
from tests.support.backends import POOL, MemoryBackend, request, warm


async def test_a_group_the_pool_can_never_hold_is_refused_at_once() -> None:
    backend = MemoryBackend()
    small = replace(POOL, max_sandboxes=4)
    backend.pool = lambda name: small if name == "python" else None  # type: ignore[method-assign]
    service = LeaseService(backend)
    with pytest.raises(CapacityError, match="holds at most 4"):
        await asyncio.wait_for(service.acquire(request(count=5, wait_seconds=30)), 0.5)
    assert service.waiting("python") == 0


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
