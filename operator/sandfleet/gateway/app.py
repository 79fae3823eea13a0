"""The gateway's HTTP API (FastAPI): thin routes over the lease service and the agent proxy."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, Histogram, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from sandfleet import __version__
from sandfleet.core import api
from sandfleet.core.leases import LeaseError
from sandfleet.core.policy import PolicyError
from sandfleet.core.profile import ProfileError, Span
from sandfleet.core.quotas import CapacityError, QuotaExceeded
from sandfleet.gateway.allow import allowed_methods
from sandfleet.gateway.auth import Authenticator, Caller, NotAllowed, Unauthenticated
from sandfleet.gateway.backend import Backend
from sandfleet.gateway.disconnect import ClientGone, unless_disconnected
from sandfleet.gateway.guard import Guard
from sandfleet.gateway.leasing import (
    Forbidden,
    Gone,
    LeaseRequest,
    LeaseService,
    NotFound,
    QueueFull,
    WaitTimeout,
)
from sandfleet.gateway.links import add_links
from sandfleet.gateway.metrics import GatewayMetrics
from sandfleet.gateway.models import (
    AGENT_PROBLEM,
    AcquireRequest,
    AcquireResponse,
    BulkReleaseResponse,
    LeaseList,
    LeaseResponse,
    LeaseView,
    PoolList,
    PoolView,
    PrefetchRequest,
    PrefetchResponse,
    Problem,
    ReleaseResponse,
    RenewRequest,
    Timings,
)
from sandfleet.gateway.proxy import AgentProxy, SandboxUnreachable
from sandfleet.gateway.run_models import (
    PolicyView,
    ProfileView,
    PublishPolicy,
    SpansRequest,
    SpansResponse,
)
from sandfleet.gateway.runs import (
    RUN_NAME,
    InvalidRunName,
    MemoryPolicyStore,
    NotYourRun,
    PolicyStore,
    Runs,
    StalePolicy,
)
from sandfleet.gateway.settings import CapacitySettings, TenantSettings


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


def _problem(status: int, error: str, detail: str, **extra: Any) -> JSONResponse:
    headers = {}
    if extra.get("retry_after_seconds") is not None:
        headers["Retry-After"] = str(extra["retry_after_seconds"])
    body = Problem(error=error, detail=detail, **extra).model_dump(exclude_none=True)
    return JSONResponse(body, status_code=status, headers=headers)


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "description": text}
    for code, text in {
        400: "The body is not valid JSON, or the sandbox's agent refused the request.",
        401: "No or unknown bearer token.",
        403: "The caller may not use this pool, lease or run.",
        404: "No such pool or lease.",
        409: "The episode's policy version is beyond its run's staleness bound, or a version went back.",
        410: "The lease has ended (released or expired).",
        413: "The body is larger than the route accepts (1 MiB for control routes by default).",
        422: "The request is malformed: the detail says which field and why.",
        429: "The pool's queue is full, or the caller holds its quota of leases: retry after Retry-After.",
        502: "The sandbox's agent did not answer: the sandbox is lost.",
        503: "The Kubernetes API is unreachable or the gateway is not synced yet.",
        504: "No warm sandbox within wait_seconds: the detail has the queue position and ETA.",
    }.items()
}


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


async def current_caller(request: Request, authorization: Annotated[str | None, Header()] = None) -> Caller:
    """The authenticated caller of a request (401 before any work when there is none)."""
    known = getattr(request.state, "caller", None)  # the Guard authenticated it before the body
    if isinstance(known, Caller):
        return known
    authenticator: Authenticator = request.app.state.authenticator
    return await authenticator.authenticate(authorization)


Authed = Annotated[Caller, Depends(current_caller)]
# The agent's job ids are hex; anything else would be spliced into the agent's URL (a control
# character makes it invalid, a '?' or '/' would reach another route): refused here with a 422.
JobId = Annotated[str, PathParam(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
RunName = Annotated[str, PathParam(pattern=RUN_NAME, max_length=63)]


def create_app(runtime: Runtime) -> FastAPI:
    """The gateway app over one runtime (Kubernetes or local)."""
    tenancy = runtime.tenancy or TenantSettings()
    metrics = GatewayMetrics(metric_runs=tenancy.metric_runs)
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

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        yield
        await proxy.close()
        await runtime.stop()

    app = FastAPI(
        title="sandfleet gateway",
        version=__version__,
        description="Episode leases on gVisor sandboxes, and their data plane.",
        lifespan=lifespan,
        responses=ERRORS,
    )
    app.state.service = service
    app.state.authenticator = runtime.authenticator
    app.state.metrics = metrics
    app.state.runs = runs

    # Outside everything else: nobody gets a body byte read, or a route resolved, before auth.
    app.add_middleware(Guard, authenticator=runtime.authenticator, limits=tenancy.body_limits())
    app.add_middleware(RequestMetrics, histogram=metrics.request_duration)

    # -- errors: every one is a Problem with what to do, never a stack trace -------------------

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        parts = []
        for item in error.errors():
            where = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
            parts.append(f"{where or 'body'}: {item.get('msg', 'invalid')}")
        return _problem(422, "invalid_request", "; ".join(parts))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        if error.status_code != 405:
            return _problem(error.status_code, "http_error", str(error.detail))
        allow = allowed_methods(app.router.routes, request.scope)
        detail = f"{request.method} is not allowed on this path; it accepts {allow}"
        response = _problem(405, "method_not_allowed", detail)
        response.headers["Allow"] = allow
        return response

    handlers: dict[type[Exception], tuple[int, str]] = {
        Unauthenticated: (401, "unauthenticated"),
        NotAllowed: (403, "forbidden"),
        Forbidden: (403, "forbidden"),
        NotYourRun: (403, "run_forbidden"),
        InvalidRunName: (422, "invalid_run"),
        NotFound: (404, "not_found"),
        Gone: (410, "lease_ended"),
        LeaseError: (422, "invalid_lease"),
        StalePolicy: (409, "policy_stale"),
        PolicyError: (409, "policy_conflict"),
        ProfileError: (422, "invalid_span"),
        SandboxUnreachable: (502, "sandbox_lost"),
        ClientGone: (499, "client_closed_request"),  # nobody reads it: the connection is gone
    }
    for exception_type, (status, code) in handlers.items():

        async def handle(
            _: Request, error: Exception, status: int = status, code: str = code
        ) -> JSONResponse:
            headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
            response = _problem(status, code, str(error))
            if headers:
                response.headers.update(headers)
            return response

        app.add_exception_handler(exception_type, handle)

    @app.exception_handler(QueueFull)
    async def queue_full(_: Request, error: QueueFull) -> JSONResponse:
        a = error.admission
        return _problem(
            429,
            "queue_full",
            str(error),
            queue_position=a.position,
            eta_seconds=round(a.eta_seconds, 3),
            retry_after_seconds=a.retry_after_seconds,
        )

    @app.exception_handler(CapacityError)
    async def over_capacity(_: Request, error: CapacityError) -> JSONResponse:
        return _problem(422, error.code, str(error))

    @app.exception_handler(QuotaExceeded)
    async def over_quota(_: Request, error: QuotaExceeded) -> JSONResponse:
        return _problem(429, "quota_exceeded", str(error), retry_after_seconds=error.retry_after_seconds)

    @app.exception_handler(WaitTimeout)
    async def wait_timeout(_: Request, error: WaitTimeout) -> JSONResponse:
        return _problem(
            504,
            "no_sandbox_in_time",
            str(error),
            queue_position=error.position,
            eta_seconds=round(error.eta_seconds, 3),
            retry_after_seconds=max(1, round(error.eta_seconds)),
        )

    @app.exception_handler(Exception)
    async def unavailable(_: Request, error: Exception) -> JSONResponse:
        # Reached when the apiserver (or another dependency) fails mid-request: a 503 to retry.
        return _problem(
            503,
            "unavailable",
            f"a dependency failed ({type(error).__name__}); retry shortly",
            retry_after_seconds=2,
        )

    # -- health and metrics ----------------------------------------------------------------------

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], responses={503: ERRORS[503]})
    async def readyz() -> JSONResponse:
        if not runtime.ready():
            return _problem(503, "not_ready", "not synced with the runtime yet", retry_after_seconds=1)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics", tags=["health"], response_class=Response)
    async def metrics_endpoint() -> Response:
        metrics.leases_active.set(len(service.leases()))
        metrics.token_cache_entries.set(len(runtime.authenticator.token_cache))
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # -- pools and leases ------------------------------------------------------------------------

    @app.get("/v1/pools", tags=["pools"])
    async def list_pools(who: Authed) -> PoolList:
        views = []
        for pool in runtime.backend.pools():
            sandboxes = runtime.backend.sandboxes(pool.name)
            views.append(
                PoolView(
                    name=pool.name,
                    regions=list(pool.regions),
                    image=pool.image,
                    warm=sum(s.warm for s in sandboxes),
                    leased=sum(s.state == api.LEASE_LEASED for s in sandboxes),
                    waiting=service.waiting(pool.name),
                    default_ttl_seconds=pool.default_ttl_seconds,
                    max_ttl_seconds=pool.max_ttl_seconds,
                )
            )
        return PoolList(pools=views)

    @app.post("/v1/leases", status_code=201, tags=["leases"])
    async def acquire(body: AcquireRequest, who: Authed, http: Request) -> AcquireResponse:
        started = time.perf_counter()
        if body.pool is None and body.image is None:
            raise LeaseError("give a pool, an image, or both")
        pool = body.pool or service.pool_for_image(body.image or "")
        service.pool(pool)
        await runtime.authenticator.authorize(who, pool)
        if "run" in body.labels:  # its leases feed the run's profile: only the run's owner's may
            await runs.claim(body.labels["run"], who)
        request = LeaseRequest(
            pool=pool,
            holder=who.name,
            image=body.image,
            count=body.count,
            regions=tuple(body.regions),
            ttl_seconds=body.ttl_seconds,
            labels=await runs.admit(body.labels, body.policy_version),
            idempotency_key=body.idempotency_key,
            policy_version=body.policy_version,
            wait_seconds=body.wait_seconds,
        )
        try:
            # A caller who hangs up leaves the queue, and whatever was claimed for it goes back.
            granted = await unless_disconnected(http, service.acquire(request))
        except (QueueFull, QuotaExceeded, CapacityError, WaitTimeout, ClientGone) as error:
            result = "timeout" if isinstance(error, WaitTimeout) else "rejected"
            result = "abandoned" if isinstance(error, ClientGone) else result
            metrics.acquisitions.labels(pool, "rejected").inc(body.count)
            metrics.lease_wait.labels(pool, result).observe(time.perf_counter() - started)
            raise
        result = "queued" if granted.position or granted.queue_seconds > 0.05 else "warm_hit"
        result = "cold" if granted.boot_seconds > 0 else result
        metrics.acquisitions.labels(pool, result).inc(len(granted.leases))
        total = time.perf_counter() - started
        metrics.lease_wait.labels(pool, result).observe(total)
        leases = [lease for lease, _ in granted.leases]
        runs.leased(leases, granted.queue_seconds, granted.claim_seconds, granted.boot_seconds)
        return AcquireResponse(
            leases=[LeaseView.of(lease, sandbox) for lease, sandbox in granted.leases],
            queue_position=granted.position,
            timings=Timings(
                queue_ms=granted.queue_seconds * 1000,
                claim_ms=granted.claim_seconds * 1000,
                boot_ms=granted.boot_seconds * 1000,
                total_ms=total * 1000,
            ),
        )

    @app.post("/v1/prefetch", tags=["pools"])
    async def prefetch(body: PrefetchRequest, who: Authed) -> PrefetchResponse:
        service.pool(body.pool)
        await runtime.authenticator.authorize(who, body.pool)
        images = [(item.image, item.count) for item in body.images]
        names = await service.prefetch(body.pool, images, body.ttl_seconds)
        return PrefetchResponse(pool=body.pool, prewarms=names)

    @app.get("/v1/leases", tags=["leases"])
    async def list_leases(
        who: Authed,
        pool: Annotated[str | None, Query(max_length=253)] = None,
        run: Annotated[str | None, Query(max_length=253)] = None,
    ) -> LeaseList:
        found = service.leases(pool=pool, run=run, holder=who.name)
        return LeaseList(leases=[LeaseView.of(lease, sandbox) for lease, sandbox in found])

    @app.get("/v1/leases/{lease_id}", tags=["leases"])
    async def get_lease(lease_id: str, who: Authed) -> LeaseResponse:
        lease, sandbox = await service.current(lease_id, who.name)
        return LeaseResponse(lease=LeaseView.of(lease, sandbox))

    @app.post("/v1/leases/{lease_id}/renew", tags=["leases"])
    async def renew(lease_id: str, body: RenewRequest, who: Authed) -> LeaseResponse:
        lease = await service.renew(lease_id, who.name, body.ttl_seconds)
        _, sandbox = await service.current(lease_id, who.name)
        return LeaseResponse(lease=LeaseView.of(lease, sandbox))

    @app.delete("/v1/leases/{lease_id}", tags=["leases"])
    async def release(lease_id: str, who: Authed) -> ReleaseResponse:
        released = await service.release(lease_id, who.name)
        if released:
            await runs.released(lease_id)
        return ReleaseResponse(id=lease_id, released=released)

    @app.post("/v1/runs/{run}/release", tags=["leases"])
    async def release_run(run: RunName, who: Authed) -> BulkReleaseResponse:
        released = await service.release_run(run, who.name)
        for lease_id in released:
            await runs.released(lease_id)
        return BulkReleaseResponse(run=run, released=released)

    # -- runs: policy versions and the loop profile ----------------------------------------------

    @app.post("/v1/runs/{run}/policy", tags=["runs"])
    async def publish_policy(run: RunName, body: PublishPolicy, who: Authed) -> PolicyView:
        return PolicyView.of(await runs.publish(run, body.version, body.staleness_bound, body.mode, who))

    @app.get("/v1/runs/{run}/policy", tags=["runs"])
    async def get_policy(run: RunName, who: Authed) -> PolicyView:
        await runs.check(run, who)
        policy = await runs.policy(run)
        if policy is None:
            raise NotFound(f"run {run!r} has no published policy: POST /v1/runs/{run}/policy")
        return PolicyView.of(policy)

    @app.post("/v1/runs/{run}/spans", tags=["runs"])
    async def report_spans(run: RunName, body: SpansRequest, who: Authed) -> SpansResponse:
        await runs.claim(run, who)
        spans = [Span(s.phase, s.start, s.end, s.source, s.worker) for s in body.spans]
        return SpansResponse(run=run, recorded=runs.record(run, spans, body.dropped_stale))

    @app.get("/v1/runs/{run}/profile", tags=["runs"])
    async def get_profile(
        run: RunName, who: Authed, window_seconds: Annotated[float, Query(gt=0, le=86400)] = 300.0
    ) -> ProfileView:
        await runs.check(run, who)
        return ProfileView.of(run, runs.profile(run, window_seconds), await runs.policy(run))

    # -- data plane: the leased sandbox's agent, through the gateway ---------------------------

    async def forward(
        request: Request, lease_id: str, who: Caller, agent_path: str, stream: bool = False
    ) -> Response:
        started = time.perf_counter()
        started_wall = time.time()
        _, sandbox = await service.current(lease_id, who.name)
        url = sandbox.agent_url()
        if url is None:
            raise SandboxUnreachable("the sandbox has no address yet; release it and lease another")
        response, agent_seconds = await proxy.forward(
            request, url, agent_path, stream=stream, sandbox=sandbox.name
        )
        if agent_path.startswith("/v1/exec"):
            metrics.exec_seconds.observe(agent_seconds)
        # Every call counts (idle is the time between calls); evaluate runs the tests: scoring.
        phase = "score" if agent_path == "/v1/evaluate" else "exec"
        runs.exec_done(lease_id, started_wall, agent_seconds, phase)
        total = (time.perf_counter() - started) * 1000
        response.headers["Server-Timing"] = f"exec;dur={agent_seconds * 1000:.2f}, total;dur={total:.2f}"
        return response

    data_plane = [
        ("POST", "/exec", "/v1/exec", False, "Run a command (argv or shell) and wait for it."),
        ("POST", "/exec/stream", "/v1/exec/stream", True, "Run a command, streaming NDJSON events."),
        ("POST", "/jobs", "/v1/jobs", False, "Start a background job."),
        ("GET", "/jobs", "/v1/jobs", False, "List background jobs."),
        ("GET", "/jobs/{job}", "/v1/jobs/{job}", False, "A job's status."),
        ("GET", "/jobs/{job}/wait", "/v1/jobs/{job}/wait", False, "Wait for a job to end."),
        ("GET", "/jobs/{job}/output", "/v1/jobs/{job}/output", False, "A job's output so far."),
        ("POST", "/jobs/{job}/kill", "/v1/jobs/{job}/kill", False, "Kill a job's process group."),
        ("DELETE", "/jobs/{job}", "/v1/jobs/{job}", False, "Forget a finished job."),
        ("GET", "/files", "/v1/files", False, "Read a file."),
        ("PUT", "/files", "/v1/files", False, "Write a file."),
        ("DELETE", "/files", "/v1/files", False, "Delete a file or tree."),
        ("GET", "/files/list", "/v1/files/list", False, "List a directory."),
        ("GET", "/files/stat", "/v1/files/stat", False, "Stat a path."),
        ("GET", "/files/archive", "/v1/files/archive", True, "Download a tree as tar."),
        ("PUT", "/files/archive", "/v1/files/archive", False, "Upload a tar into a tree."),
        ("POST", "/evaluate", "/v1/evaluate", False, "Apply a patch, run the tests, get a reward."),
    ]

    def proxied(agent_path: str, stream: bool) -> Callable[..., Awaitable[Response]]:
        if "{job}" in agent_path:

            async def job_route(request: Request, lease_id: str, job: JobId, who: Authed) -> Response:
                return await forward(request, lease_id, who, agent_path.format(job=job), stream)

            return job_route

        async def route(request: Request, lease_id: str, who: Authed) -> Response:
            return await forward(request, lease_id, who, agent_path, stream)

        return route

    bodies = {
        "POST": {"application/json": {"schema": {"type": "object"}}},
        "PUT": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
    for method, suffix, agent_path, stream, summary in data_plane:
        body = bodies.get(method)
        app.add_api_route(
            f"/v1/leases/{{lease_id}}{suffix}",
            proxied(agent_path, stream),
            methods=[method],
            summary=summary,
            tags=["sandbox"],
            response_class=Response,
            responses=_agent_responses(method, agent_path),
            openapi_extra={"requestBody": {"content": body}} if body else None,
        )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = add_links(FastAPI.openapi(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _agent_responses(method: str, agent_path: str) -> dict[int | str, dict[str, Any]]:
    """What the agent itself may answer on a data-plane route (passed through as it is)."""
    responses: dict[int | str, dict[str, Any]] = {
        200: {"description": "The agent's own response, passed through."}
    }
    if method == "POST" and agent_path == "/v1/jobs":
        responses[201] = {"description": "The job started: its status (job_id for the job routes)."}
    if method in ("POST", "PUT"):
        responses[413] = {"description": "The body is larger than the agent accepts."}
    # The agent's own refusals pass through in its shape; the gateway's (no lease, ...) are Problems.
    either = {"anyOf": [{"$ref": "#/components/schemas/Problem"}, AGENT_PROBLEM]}
    for status in (400, 403, 404, 413, 422):
        described = responses.get(status) or ERRORS.get(status) or {"description": "The agent refused."}
        responses[status] = {
            "description": described["description"],
            "content": {"application/json": {"schema": either}},
        }
    return responses
