"""Probes and metrics: the routes anybody may call."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sandfleet.gateway.routes.deps import PartsDep
from sandfleet.gateway.routes.errors import ERRORS, problem
from sandfleet.kube.metrics import KUBE_REGISTRY

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", responses={503: ERRORS[503]})
async def readyz(shared: PartsDep) -> JSONResponse:
    if not shared.ready():
        return problem(503, "not_ready", "not synced with the runtime yet", retry_after_seconds=1)
    return JSONResponse({"status": "ready"})


@router.get("/metrics", response_class=Response)
async def metrics_endpoint(shared: PartsDep) -> Response:
    shared.metrics.leases_active.set(len(shared.service.leases()))
    shared.metrics.token_cache_entries.set(len(shared.authenticator.token_cache))
    # The informers' counters are process-wide (one set per watched resource), the rest per app.
    body = generate_latest(shared.metrics.registry) + generate_latest(KUBE_REGISTRY)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
