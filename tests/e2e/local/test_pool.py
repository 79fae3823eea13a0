"""The in-process warm pool over real sandboxes: warm leases, refill, cold fallback, clean close."""

from __future__ import annotations

import httpx
import pytest

from sandfleet.local.pool import WarmPool
from sandfleet.local.runtime import LocalRuntime
from tests.e2e.local.conftest import host_debris

pytestmark = pytest.mark.gvisor


async def test_warm_leases_refill_and_cold_fallback(runtime: LocalRuntime) -> None:
    pool = WarmPool(runtime, size=2)
    pool.start()
    await pool.wait_full(timeout_s=60)
    assert pool.ready_count == 2

    first = await pool.acquire()
    assert first.warm is True
    second = await pool.acquire()
    assert second.warm is True
    # Both warm sandboxes are gone and the refill has not finished: the next lease is cold.
    third = await pool.acquire()
    assert third.warm is False
    async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
        for lease in (first, second, third):
            response = await client.post(
                f"{lease.sandbox.url}/v1/exec", json={"argv": ["true"]}, headers=lease.sandbox.headers
            )
            assert response.json()["exit_code"] == 0
    leased = [first.sandbox, second.sandbox, third.sandbox]
    for lease in (first, second, third):
        pool.release(lease)
    await pool.wait_full(timeout_s=60)
    assert pool.ready_count == 2

    pool.resize(1)
    await runtime.drain()
    assert pool.ready_count == 1
    await pool.close()
    await runtime.drain()
    assert host_debris(runtime, leased) == {}
    assert runtime.sandboxes == {}
