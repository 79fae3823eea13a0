"""The `boot` phase: the part of an acquire's wait spent on its sandbox still being created (cold)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from sandfleet.core.leases import LeaseRecord
from sandfleet.gateway import lease_queue
from sandfleet.gateway.app import Runtime, create_app
from sandfleet.gateway.auth import Authenticator
from sandfleet.gateway.lease_requests import LeaseRequest
from sandfleet.gateway.leasing import LeaseService
from sandfleet.gateway.metrics import GatewayMetrics
from sandfleet.gateway.runs import MemoryPolicyStore, Runs
from tests.support.backends import MemoryBackend
from tests.unit.gateway.virtual_time import on_virtual_time


def add_booted(backend: MemoryBackend, name: str, created_at: float) -> None:
    """A sandbox that began its creation at `created_at` and is ready now."""
    listeners, backend.listeners = backend.listeners, []
    backend.add(name)  # quietly: the lease service hears of it once, with its creation time
    backend.listeners = listeners
    key = f"ns.{name}"
    backend.items[key] = replace(backend.items[key], created_at=created_at)
    for listener in backend.listeners:
        listener(backend.items[key])


@on_virtual_time
async def test_a_cold_acquire_splits_its_wait_into_queue_and_boot(monkeypatch: pytest.MonkeyPatch) -> None:
    # Virtual time throughout: the service's wall clock and the monotonic clock it measures waits
    # with are the loop's, so the split is exact however loaded the machine is. (lease_queue's `time`
    # name is replaced, not `time.monotonic` itself, which the rest of the process keeps using.)
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(lease_queue, "time", SimpleNamespace(monotonic=loop.time, time=loop.time))
    backend = MemoryBackend()
    service = LeaseService(backend, clock=loop.time)
    arrived = loop.time()
    waiting = asyncio.create_task(service.acquire(LeaseRequest("python", "a", wait_seconds=5)))
    await asyncio.sleep(0.3)
    add_booted(backend, "s0", created_at=arrived + 0.1)  # created 0.1 s in, ready now (0.3 s in)
    granted = await waiting
    assert granted.boot_seconds == pytest.approx(0.2)
    assert granted.queue_seconds == pytest.approx(0.1)
    assert granted.claim_seconds > 0  # the claim's own round trip, counted in neither
    total = granted.queue_seconds + granted.boot_seconds + granted.claim_seconds
    assert total == pytest.approx(loop.time() - arrived)


async def test_a_warm_acquire_has_no_boot() -> None:
    backend = MemoryBackend()
    service = LeaseService(backend)
    add_booted(backend, "s0", created_at=time.time() - 5)
    granted = await service.acquire(LeaseRequest("python", "a"))
    assert granted.boot_seconds == 0.0


async def test_the_gateway_reports_boot_in_timings_the_profile_and_metrics(tmp_path: Path) -> None:
    backend = MemoryBackend()

    async def noop() -> None:
        return None

    runtime = Runtime(
        backend=backend,
        authenticator=Authenticator(static_tokens={}, anonymous_allowed=True),
        ready=lambda: True,
        start=noop,
        stop=noop,
        policy_store=MemoryPolicyStore(tmp_path / "policies.json"),
    )
    app = create_app(runtime)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        arrived = time.time()
        body = {"pool": "python", "labels": {"run": "cold"}, "wait_seconds": 5}
        acquiring = asyncio.create_task(client.post("/v1/leases", json=body))
        # Queued first (on a loaded machine the request can take longer than any fixed sleep to
        # get there, and would then find the sandbox warm), then booting for a while longer.
        service = app.state.parts.service
        for _ in range(1000):  # 10 s at most
            if service.waiting("python"):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        add_booted(backend, "s0", created_at=arrived)
        response = await acquiring
        assert response.status_code == 201, response.text
        assert response.json()["timings"]["boot_ms"] > 150
        profile = (await client.get("/v1/runs/cold/profile")).json()
        phases = {p["phase"]: p for p in profile["phases"]}
        assert phases["boot"]["count"] == 1
        assert phases["boot"]["total_seconds"] > 0.15
        metrics = (await client.get("/metrics")).text
        cold = 'sandfleet_lease_acquisitions_total{cluster="default",pool="python",result="cold"} 1.0'
        assert cold in metrics


def test_runs_lay_queue_boot_and_claim_end_to_end() -> None:
    now = 1000.0
    runs = Runs(MemoryPolicyStore(), GatewayMetrics(), clock=lambda: now)
    lease = LeaseRecord("l1", "python", "a", now, now + 60, 60, {"run": "r"})
    runs.leased([lease], queue_seconds=0.5, claim_seconds=0.1, boot_seconds=2.0)
    spans = {s.phase: s for s in runs._spans["r"]}
    assert (spans["queue"].start, spans["queue"].end) == pytest.approx((997.4, 997.9))
    assert (spans["boot"].start, spans["boot"].end) == pytest.approx((997.9, 999.9))
    assert (spans["claim"].start, spans["claim"].end) == pytest.approx((999.9, 1000.0))
    runs.leased([replace(lease, id="l2")], 0.0, 0.01)  # warm: no boot span
    assert [s.phase for s in runs._spans["r"]].count("boot") == 1
