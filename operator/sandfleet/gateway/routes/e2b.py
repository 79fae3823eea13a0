"""E2B's sandbox API, served over leases: unmodified `e2b` SDK code creates, times and kills sandboxes here.

Point the SDK at the gateway with E2B_API_URL=<gateway>/e2b, E2B_SANDBOX_URL=<gateway>/e2b/envd and
E2B_API_KEY=<a gateway token>. A sandbox is a lease: its id is the lease id, its timeout the lease's
TTL, killing it releases the lease. The envd side (commands, files) is `e2b_envd`, present only
where the `e2b` package is installed (the `integrations` extra).
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Body, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandfleet.core import e2b
from sandfleet.gateway.models import AcquireRequest, RenewRequest
from sandfleet.gateway.routes import leases
from sandfleet.gateway.routes.deps import Authed, PartsDep

log = logging.getLogger(__name__)

router = APIRouter(prefix=e2b.API_PREFIX, tags=["e2b"], include_in_schema=False)
JsonBody = Annotated[dict[str, Any], Body()]


def refused(error: e2b.E2BRequestError) -> JSONResponse:
    return JSONResponse(e2b.api_error(error.status, str(error)), status_code=error.status)


def access_token(request: Request) -> str:
    """The caller's own bearer token: the SDK sends it back to envd as the sandbox's access token."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" else ""


@router.post("/sandboxes", status_code=201)
@router.post("/v2/sandboxes", status_code=201)
async def create(body: JsonBody, request: Request, who: Authed, shared: PartsDep) -> Response:
    try:
        pools = shared.backend.pools()
        served = {image for pool in pools for image in (pool.image, *pool.served_images)}
        wanted = e2b.acquire_body(body, [pool.name for pool in pools], served)
        acquire = AcquireRequest(**wanted)
    except e2b.E2BRequestError as error:
        return refused(error)
    except ValidationError as error:
        return refused(e2b.E2BRequestError(400, f"the sandbox cannot be leased: {error.errors()[0]['msg']}"))
    granted = await leases.acquire(acquire, who, request, shared)
    lease = granted.leases[0]
    template = lease.labels.get(e2b.TEMPLATE_LABEL, lease.pool)
    answer = e2b.created(lease.id, template, who.name, access_token(request))
    return JSONResponse(answer, status_code=201)


@router.get("/sandboxes")
@router.get("/v2/sandboxes")
async def list_sandboxes(
    who: Authed,
    shared: PartsDep,
    metadata: str | None = None,
    state: str = "",
    template: str = "",
) -> list[dict[str, Any]]:
    wanted = e2b.metadata_filter(metadata)
    states = [s for s in state.split(",") if s]
    found = (await leases.list_leases(who, shared)).leases
    return [
        e2b.detail(
            v.id, v.labels.get(e2b.TEMPLATE_LABEL, v.pool), who.name, v.acquired_at, v.expires_at, v.labels
        )
        for v in found
        if e2b.listed(v.labels, wanted, states, template)
    ]


@router.get("/sandboxes/{sandbox_id}")
async def info(sandbox_id: str, who: Authed, shared: PartsDep) -> dict[str, Any]:
    lease = (await leases.get_lease(sandbox_id, who, shared)).lease
    template = lease.labels.get(e2b.TEMPLATE_LABEL, lease.pool)
    return e2b.detail(lease.id, template, who.name, lease.acquired_at, lease.expires_at, lease.labels)


@router.post("/sandboxes/{sandbox_id}/connect")
@router.post("/v2/sandboxes/{sandbox_id}/connect")
async def connect(
    sandbox_id: str, body: JsonBody, request: Request, who: Authed, shared: PartsDep
) -> Response:
    try:
        ttl = e2b.lease_ttl(body.get("timeout"))
    except e2b.E2BRequestError as error:
        return refused(error)
    view = (await leases.get_lease(sandbox_id, who, shared)).lease
    if ttl is not None and view.expires_at < shared.service.clock() + ttl:
        await leases.renew(sandbox_id, RenewRequest(ttl_seconds=ttl), who, shared)
    template = view.labels.get(e2b.TEMPLATE_LABEL, view.pool)
    return JSONResponse(e2b.created(view.id, template, who.name, access_token(request)))


@router.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
async def set_timeout(sandbox_id: str, body: JsonBody, who: Authed, shared: PartsDep) -> Response:
    try:
        ttl = e2b.lease_ttl(body.get("timeout"))
    except e2b.E2BRequestError as error:
        return refused(error)
    await leases.renew(sandbox_id, RenewRequest(ttl_seconds=ttl), who, shared)
    return Response(status_code=204)


@router.delete("/sandboxes/{sandbox_id}", status_code=204)
async def kill(sandbox_id: str, who: Authed, shared: PartsDep) -> Response:
    released = await leases.release(sandbox_id, who, shared)
    if not released.released:
        return refused(e2b.E2BRequestError(404, f"sandbox {sandbox_id} not found (or already killed)"))
    return Response(status_code=204)


class Credentials:
    """Turns the SDK's credentials into the gateway's bearer token, before the Guard reads it.

    It also gives the gateway's own error answers on E2B paths the `message` the SDK reports.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(e2b.API_PREFIX + "/"):
            await self.app(scope, receive, send)
            return
        raw: list[tuple[bytes, bytes]] = list(scope["headers"])
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw}
        token = e2b.bearer(path, headers)
        if token is not None:
            raw = [(k, v) for k, v in raw if k.lower() != b"authorization"]
            raw.append((b"authorization", f"Bearer {token}".encode("latin-1")))
        await self.app({**scope, "headers": raw}, receive, ErrorMessages(send))


class ErrorMessages:
    """A send that adds E2B's `code` and `message` to the gateway's JSON Problems (small bodies)."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.start: Message | None = None
        self.chunks: list[bytes] = []

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            content_type = dict(message.get("headers", [])).get(b"content-type", b"")
            if message["status"] >= 400 and content_type.startswith(b"application/json"):
                self.start = message
                return
        if self.start is None or message["type"] != "http.response.body":
            await self.send(message)
            return
        self.chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        body = with_message(b"".join(self.chunks), self.start["status"])
        headers = [(k, v) for k, v in self.start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self.send({**self.start, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})


def with_message(body: bytes, status: int) -> bytes:
    """A Problem (`error`, `detail`) with E2B's `code` and `message` added; anything else as it is."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body
    if not isinstance(parsed, dict) or "detail" not in parsed or "message" in parsed:
        return body
    return json.dumps({**parsed, "code": status, "message": str(parsed["detail"])}).encode()


def install(app: FastAPI) -> None:
    """Serve E2B's API on `app`: the control plane always, envd where the `e2b` package is installed."""
    app.include_router(router)
    try:
        from sandfleet.gateway.routes import e2b_envd
    except ImportError as error:  # the SDK's envd definitions come with it: without them, no envd
        log.info("E2B envd routes are off (%s): install sandfleet[integrations] for them", error)
    else:
        app.include_router(e2b_envd.router)
        app.mount(e2b.ENVD_PREFIX, e2b_envd.Services(app.state.parts))
    app.add_middleware(Credentials)
