"""Leases: acquire (queued, counted), list, read, renew and release them, one at a time or per run."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query, Request

from sandfleet.core.leases import LeaseError
from sandfleet.core.quotas import CapacityError, QuotaExceeded
from sandfleet.gateway.auth import Caller
from sandfleet.gateway.disconnect import ClientGone, unless_disconnected
from sandfleet.gateway.lease_errors import PoolQueueFull, WaitTimeout
from sandfleet.gateway.lease_requests import Granted, LeaseRequest
from sandfleet.gateway.models import (
    AcquireRequest,
    AcquireResponse,
    BulkReleaseResponse,
    LeaseList,
    LeaseResponse,
    LeaseView,
    ReleaseResponse,
    RenewRequest,
    Timings,
)
from sandfleet.gateway.routes.deps import Authed, Parts, PartsDep, RunName
from sandfleet.wire import FRESH_KEY_HEADER

router = APIRouter(tags=["leases"])

# An acquire that ends in one of these is counted as refused (and the error answers the caller).
REFUSED = (PoolQueueFull, QuotaExceeded, CapacityError, WaitTimeout, ClientGone)


def refused_result(error: Exception) -> str:
    """The `result` label of a refused acquire's wait: a timeout, the caller hanging up, or a refusal."""
    if isinstance(error, ClientGone):
        return "abandoned"
    return "timeout" if isinstance(error, WaitTimeout) else "rejected"


def granted_result(granted: Granted) -> str:
    """The `result` label of a grant: a sandbox still booting, a wait in the queue, or a warm hit."""
    if granted.boot_seconds > 0:
        return "cold"
    return "queued" if granted.position or granted.queue_seconds > 0.05 else "warm_hit"


async def lease_request(
    body: AcquireRequest, who: Caller, shared: Parts, fresh_key: bool = False
) -> LeaseRequest:
    """What `who` asks for, once its pool exists and it may use the pool (and the run it labels)."""
    if body.pool is None and body.image is None:
        raise LeaseError("give a pool, an image, or both")
    pool = body.pool or shared.service.pool_for_image(body.image or "")
    shared.service.pool(pool)
    await shared.authenticator.authorize(who, pool)
    if "run" in body.labels:  # its leases feed the run's profile: only the run's owner's may
        await shared.runs.claim(body.labels["run"], who)
    return LeaseRequest(
        pool=pool,
        holder=who.name,
        image=body.image,
        count=body.count,
        regions=tuple(body.regions),
        ttl_seconds=body.ttl_seconds,
        labels=await shared.runs.admit(body.labels, body.policy_version),
        idempotency_key=body.idempotency_key,
        policy_version=body.policy_version,
        wait_seconds=body.wait_seconds,
        min_count=body.min_count,
        fresh_key=fresh_key,
    )


def acquire_response(granted: Granted, requested: int, total_seconds: float) -> AcquireResponse:
    return AcquireResponse(
        leases=[LeaseView.of(lease, sandbox) for lease, sandbox in granted.leases],
        requested=requested,
        granted=len(granted.leases),
        queue_position=granted.position,
        timings=Timings(
            queue_ms=granted.queue_seconds * 1000,
            claim_ms=granted.claim_seconds * 1000,
            boot_ms=granted.boot_seconds * 1000,
            total_ms=total_seconds * 1000,
        ),
    )


@router.post("/v1/leases", status_code=201)
async def acquire(body: AcquireRequest, who: Authed, http: Request, shared: PartsDep) -> AcquireResponse:
    started = time.perf_counter()
    fresh_key = http.headers.get(FRESH_KEY_HEADER) == "true"
    request = await lease_request(body, who, shared, fresh_key)
    metrics = shared.metrics
    try:
        # A caller who hangs up leaves the queue, and whatever was claimed for it goes back.
        granted = await unless_disconnected(http, shared.service.acquire(request))
    except REFUSED as error:
        metrics.refused(request.pool, refused_result(error), body.count, time.perf_counter() - started)
        raise
    result, total = granted_result(granted), time.perf_counter() - started
    metrics.granted(request.pool, result, [sandbox.cluster for _, sandbox in granted.leases], total)
    leases = [lease for lease, _ in granted.leases]
    shared.runs.leased(leases, granted.queue_seconds, granted.claim_seconds, granted.boot_seconds)
    return acquire_response(granted, body.count, total)


@router.get("/v1/leases")
async def list_leases(
    who: Authed,
    shared: PartsDep,
    pool: Annotated[str | None, Query(max_length=253)] = None,
    run: Annotated[str | None, Query(max_length=253)] = None,
) -> LeaseList:
    found = shared.service.leases(pool=pool, run=run, holder=who.name)
    return LeaseList(leases=[LeaseView.of(lease, sandbox) for lease, sandbox in found])


@router.get("/v1/leases/{lease_id}")
async def get_lease(lease_id: str, who: Authed, shared: PartsDep) -> LeaseResponse:
    lease, sandbox = await shared.service.current(lease_id, who.name)
    return LeaseResponse(lease=LeaseView.of(lease, sandbox))


@router.post("/v1/leases/{lease_id}/renew")
async def renew(lease_id: str, body: RenewRequest, who: Authed, shared: PartsDep) -> LeaseResponse:
    lease = await shared.service.renew(lease_id, who.name, body.ttl_seconds)
    _, sandbox = await shared.service.current(lease_id, who.name)
    return LeaseResponse(lease=LeaseView.of(lease, sandbox))


@router.delete("/v1/leases/{lease_id}")
async def release(lease_id: str, who: Authed, shared: PartsDep) -> ReleaseResponse:
    released = await shared.service.release(lease_id, who.name)
    if released:
        await shared.runs.released(lease_id)
    return ReleaseResponse(id=lease_id, released=released)


@router.post("/v1/runs/{run}/release")
async def release_run(run: RunName, who: Authed, shared: PartsDep) -> BulkReleaseResponse:
    released = await shared.service.release_run(run, who.name)
    for lease_id in released:
        await shared.runs.released(lease_id)
    return BulkReleaseResponse(run=run, released=released)
