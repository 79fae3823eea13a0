"""The gateway's front door: authenticate before any body byte is read, cap bodies, time out slow ones."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandfleet.gateway.auth import Authenticator, Unauthenticated

log = logging.getLogger(__name__)

# Routes anybody may call: probes, metrics and the schema. Everything else needs a caller first.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/redoc"})
_DATA_PLANE = re.compile(r"^/v1/leases/[^/]+/(exec|jobs|files|evaluate)(/|$)")
_UPLOADS = re.compile(r"^/v1/leases/[^/]+/files(/archive)?$")
# E2B's envd upload: an octet-stream body streams through to the agent like our own uploads; a
# multipart one is parsed in the gateway (gateway/routes/e2b_envd.py), so it gets the data plane's
# buffered cap. Either may arrive over a while, like any upload.
_E2B_UPLOADS = re.compile(r"^/e2b/envd/files$")


@dataclass(frozen=True)
class BodyLimits:
    """How many body bytes a route may get, and how long a body may stall."""

    control: int = 1 << 20  # JSON control routes: leases, runs, prefetch
    agent: int = 64 << 20  # data-plane JSON (exec, jobs, evaluate): the agent's own JSON cap
    upload: int = 1 << 30  # file and archive uploads, streamed through to the agent
    idle_seconds: float = 30.0

    def cap(self, method: str, path: str, content_type: str = "") -> int:
        if method == "PUT" and _UPLOADS.match(path):
            return self.upload
        if method == "POST" and _E2B_UPLOADS.match(path):
            return self.agent if is_multipart(content_type) else self.upload
        if _DATA_PLANE.match(path):
            return self.agent
        return self.control


def is_multipart(content_type: str) -> bool:
    """Whether a Content-Type is multipart/form-data (parameters and case aside)."""
    return content_type.split(";", 1)[0].strip().lower() == "multipart/form-data"


def streamed(path: str) -> bool:
    """Whether a route's body may take a while (an upload), as long as it never pauses for long."""
    return bool(_DATA_PLANE.match(path) or _E2B_UPLOADS.match(path))


def _problem(status: int, error: str, detail: str, headers: dict[str, str] | None = None) -> list[Message]:
    body = json.dumps({"error": error, "detail": detail}).encode()
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),  # the unread rest of the body makes the connection unusable
    ]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return [
        {"type": "http.response.start", "status": status, "headers": raw},
        {"type": "http.response.body", "body": body},
    ]


class _BodyRefused(Exception):
    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.error, self.detail = status, error, detail


class Guard:
    """A plain ASGI middleware in front of the app.

    FastAPI reads (and parses) a JSON body before it resolves a route's dependencies, so an auth
    dependency alone answers 401 only after the whole body sits in memory. Here the caller is
    authenticated from the headers first, the body is counted as it arrives (a declared length over
    the cap is refused before a byte is read), and a body that stalls is cut off: nothing an
    unauthenticated or slow client sends is ever buffered.
    """

    def __init__(self, app: ASGIApp, authenticator: Authenticator, limits: BodyLimits) -> None:
        self.app = app
        self.authenticator = authenticator
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            caller = await self.authenticator.authenticate(headers.get("authorization"))
        except Unauthenticated as error:
            await self._answer(send, 401, "unauthenticated", str(error), {"WWW-Authenticate": "Bearer"})
            return
        except Exception as error:  # the TokenReview itself failed: the apiserver is away
            log.warning("authenticating a request failed: %s", error)
            detail = f"authentication is unavailable ({type(error).__name__}); retry shortly"
            await self._answer(send, 503, "unavailable", detail, {"Retry-After": "2"})
            return
        scope.setdefault("state", {})["caller"] = caller
        cap = self.limits.cap(scope["method"], scope["path"], headers.get("content-type", ""))
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            await self._answer(send, 413, "body_too_large", _too_large(int(declared), cap))
            return
        # A control body (at most a MiB) must be in within the idle bound altogether; an upload only
        # may never pause that long, so a client trickling a byte at a time cannot hold a request.
        whole = not streamed(scope["path"])
        await self._serve(scope, receive, send, cap, whole)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, cap: int, whole: bool) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.idle_seconds
        received = 0
        complete = False
        refused: _BodyRefused | None = None
        started = False

        async def counted() -> Message:
            nonlocal received, complete, refused
            if refused is not None:
                return {"type": "http.disconnect"}
            if complete:  # the body is in: what is left is waiting for a disconnect, not timed
                return await receive()
            wait = deadline - loop.time() if whole else self.limits.idle_seconds
            try:
                message = await asyncio.wait_for(receive(), max(wait, 0.0))
            except TimeoutError:
                limit = self.limits.idle_seconds
                detail = (
                    f"the body took longer than {limit:g} s: send it at once"
                    if whole
                    else f"no body bytes for {limit:g} s: send the body without pausing"
                )
                refused = _BodyRefused(408, "body_timeout", detail)
                raise refused from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if received > cap:
                    refused = _BodyRefused(413, "body_too_large", _too_large(received, cap, sent=True))
                    raise refused
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if refused is not None and not started:
                return  # the refusal is answered below; whatever the app says instead is dropped
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except _BodyRefused:
            pass
        except Exception:
            if refused is None:
                raise
        if refused is not None and not started:
            await self._answer(send, refused.status, refused.error, refused.detail)

    @staticmethod
    async def _answer(
        send: Send, status: int, error: str, detail: str, headers: dict[str, str] | None = None
    ) -> None:
        for message in _problem(status, error, detail, headers):
            await send(message)


def _too_large(size: int, cap: int, sent: bool = False) -> str:
    what = f"more than {cap} bytes were sent" if sent else f"the body is {size} bytes"
    return f"{what}; this route accepts at most {cap}: send less, or upload files with PUT /files"
