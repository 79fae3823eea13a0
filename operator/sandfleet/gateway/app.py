"""The gateway's HTTP API (FastAPI): assembles the routers over one runtime, with its guards and errors."""

from __future__ import annotations

import gc
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from prometheus_client import Histogram
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Receive, Scope, Send

from sandfleet import __version__
from sandfleet.core.api import DEFAULT_CLUSTER
from sandfleet.gateway.auth import Authenticator
from sandfleet.gateway.backend import Backend
from sandfleet.gateway.clean_scoring import LostEpisodes
from sandfleet.gateway.guard import Guard
from sandfleet.gateway.leasing import LeaseService
from sandfleet.gateway.links import add_links
from sandfleet.gateway.metrics import GatewayMetrics
from sandfleet.gateway.proxy import AgentProxy
from sandfleet.gateway.routes import e2b, health, leases, pools, runs, sandboxes
from sandfleet.gateway.routes.deps import Parts
from sandfleet.gateway.routes.errors import ERRORS, add_error_handlers
from sandfleet.gateway.run_peers import NoPeers, Peers
from sandfleet.gateway.runs import MemoryPolicyStore, PolicyStore, Runs
from sandfleet.gateway.settings import CapacitySettings, TenantSettings

# In this order: it is the order of the paths in the OpenAPI document.
ROUTERS = (health.router, pools.router, leases.router, runs.router, sandboxes.router)


@dataclass
class Runtime:
    """What a running gateway is made of; `start`/`stop` bring the backend's watches up and down."""

    backend: Backend
    authenticator: Authenticator
    ready: Callable[[], bool]
    start: Callable[[], Awaitable[None]]
    stop: Callable[[], Awaitable[None]]
    agent_key: bytes | None = None  # the fleet key every agent's token derives from
    max_waiting: int = 1000
    capacity: CapacitySettings | None = None  # quotas and the overtaking rule; defaults when None
    policy_store: PolicyStore | None = None  # memory only when None
    tenancy: TenantSettings | None = None  # run owners, body caps and timeouts; defaults when None
    collectors: tuple[Collector, ...] = ()  # the runtime's own metrics, served beside the gateway's
    peers: Peers | None = None  # the other replicas of this gateway; none (alone) when None
    cluster: str = DEFAULT_CLUSTER  # the cluster it runs in: metrics' `cluster` where no member is named
    # A server process of its own freezes its heap once started (see lifespan); tests that build many
    # apps in one process leave it off.
    freeze_heap: bool = False


class RequestMetrics:
    """Times every request by its route template (a plain ASGI middleware: no per-request task)."""

    def __init__(self, app: ASGIApp, histogram: Histogram) -> None:
        self.app = app
        self.histogram = histogram

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            template = getattr(scope.get("route"), "path", "unmatched")
            self.histogram.labels(template, scope["method"]).observe(time.perf_counter() - started)


class GatewayApp(FastAPI):
    """FastAPI whose OpenAPI document carries the links from a lease's creation to its routes."""

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            self.openapi_schema = add_links(super().openapi())
        return self.openapi_schema


def assemble(runtime: Runtime, tenancy: TenantSettings) -> Parts:
    """The objects the routes share, built from the runtime (defaults where it gives none)."""
    metrics = GatewayMetrics(metric_runs=tenancy.metric_runs, cluster=runtime.cluster)
    for collector in runtime.collectors:
        metrics.registry.register(collector)
    capacity = runtime.capacity or CapacitySettings()
    service = LeaseService(
        runtime.backend,
        max_waiting=runtime.max_waiting,
        quotas=capacity.quotas(),
        overtake_seconds=capacity.overtake_seconds,
    )
    proxy = AgentProxy(runtime.agent_key)
    runtime.backend.subscribe(proxy.on_change)  # requests to a sandbox found gone end at once
    runs = Runs(runtime.policy_store or MemoryPolicyStore(), metrics, admins=tenancy.run_admins)
    peers = runtime.peers or NoPeers()
    lost = LostEpisodes(lambda name: runtime.backend.pool(name), time.time)
    runtime.backend.subscribe(lost.on_change)  # an episode run as root that lost its sandbox scores 0
    return Parts(
        runtime.backend, runtime.authenticator, service, proxy, runs, metrics, runtime.ready, peers, lost
    )


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    runtime: Runtime = app.state.runtime
    shared: Parts = app.state.parts
    await runtime.start()
    if runtime.freeze_heap:
        # What is alive now lives as long as the process: the imports (kubernetes_asyncio's models,
        # FastAPI's, pydantic's) and the listed index. Frozen, the garbage collector's full passes no
        # longer walk it: one took 200-290 ms of a replica held to 0.4 of a core (1,200 Pods
        # listed), in the middle of a lease burst when it came then.
        gc.collect()
        gc.freeze()
    yield
    await shared.proxy.close()
    await runtime.stop()


def create_app(runtime: Runtime) -> FastAPI:
    """The gateway app over one runtime (Kubernetes or local)."""
    tenancy = runtime.tenancy or TenantSettings()
    shared = assemble(runtime, tenancy)
    app = GatewayApp(
        title="sandfleet gateway",
        version=__version__,
        description="Episode leases on gVisor sandboxes, and their data plane.",
        lifespan=lifespan,
        responses=ERRORS,
        # Metrics are Prometheus's (gateway.metrics); FastAPI's OpenTelemetry hooks, left on, look the
        # providers up in the environment on every request.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.runtime = runtime
    app.state.parts = shared
    # Outside everything else: nobody gets a body byte read, or a route resolved, before auth.
    app.add_middleware(Guard, authenticator=runtime.authenticator, limits=tenancy.body_limits())
    app.add_middleware(RequestMetrics, histogram=shared.metrics.request_duration)
    add_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    e2b.install(app)  # E2B's API over leases, for unmodified `e2b` SDK code (docs/integrations.md)
    return app
