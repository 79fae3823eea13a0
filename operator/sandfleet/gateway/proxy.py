"""The data plane: forwards exec, jobs, files and evaluate to the leased sandbox's agent.

Each request carries the sandbox's own agent token (derived from the fleet key, which only the
gateway and the sandboxes' creator hold). A request to a sandbox that is known to be gone (its
Pod terminating, its local runsc process dead) ends at once with `sandbox_lost`, in flight or not.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
from fastapi import Request, Response
from fastapi.responses import StreamingResponse

from sandfleet.core.agent_tokens import agent_token
from sandfleet.core.sandboxes import Sandbox

# Headers that describe one hop, never forwarded (RFC 9110 7.6.1), plus our own credentials.
HOP_HEADERS = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "authorization",
    "content-length",
}
# A request body is relayed byte for byte, so its length goes with it: without it the body goes
# chunked, and an agent that answers before reading a chunked body (a 404, say) must close the
# connection; the pool would hand that dying connection to the next caller, who would get a 502.
REQUEST_DROP = HOP_HEADERS - {"content-length"}


LOST = (
    "the sandbox died while this request was in flight: the sandbox is lost; "
    "release this lease and acquire another"
)


class SandboxUnreachable(ConnectionError):
    """The leased sandbox's agent did not answer: the sandbox is lost."""


class _Flight:
    """One request in flight to a sandbox, cancellable when the sandbox is lost."""

    __slots__ = ("lost", "task")

    def __init__(self, task: asyncio.Task[object] | None) -> None:
        self.task = task
        self.lost = False


class AgentProxy:
    """One pooled HTTP client to every agent (keep-alive makes an exec a single round trip)."""

    def __init__(
        self, agent_key: bytes | None = None, timeout: float = 3600.0, write_timeout: float = 60.0
    ) -> None:
        self.agent_key = agent_key
        self._flights: dict[str, set[_Flight]] = {}
        self.client = httpx.AsyncClient(
            # A write that makes no progress for a minute means the sandbox died under it (an upload
            # that filled its memory kills it silently: its netstack goes with it, so no reset comes).
            # Without this bound the caller would hang for the hour an exec may take, not get a 502.
            timeout=httpx.Timeout(timeout, connect=5.0, write=write_timeout),
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
        )

    async def close(self) -> None:
        await self.client.aclose()

    def on_change(self, sandbox: Sandbox) -> None:
        """A backend's news of a sandbox: if it is gone, end every request in flight to it."""
        if sandbox.terminating or sandbox.address is None:
            self.lost(sandbox.name)

    def lost(self, sandbox_name: str) -> None:
        """End the requests in flight to this sandbox with `sandbox_lost`."""
        for flight in self._flights.pop(sandbox_name, set()):
            flight.lost = True
            if flight.task is not None:
                flight.task.cancel(LOST)

    def _track(self, sandbox_name: str) -> _Flight:
        flight = _Flight(asyncio.current_task())
        self._flights.setdefault(sandbox_name, set()).add(flight)
        return flight

    def _untrack(self, sandbox_name: str, flight: _Flight) -> None:
        flights = self._flights.get(sandbox_name)
        if flights is not None:
            flights.discard(flight)
            if not flights:
                del self._flights[sandbox_name]

    def _headers(self, request: Request, sandbox_name: str) -> dict[str, str]:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in REQUEST_DROP}
        if "transfer-encoding" in request.headers:
            headers.pop("content-length", None)
        if self.agent_key is not None:
            headers["authorization"] = f"Bearer {agent_token(self.agent_key, sandbox_name)}"
        return headers

    async def forward(
        self, request: Request, agent_url: str, path: str, stream: bool = False, sandbox: str = ""
    ) -> tuple[Response, float]:
        """Send the caller's request to sandbox `sandbox` at `agent_url + path`; response, agent time."""
        flight = self._track(sandbox)
        try:
            return await self._forward(request, agent_url, path, stream, sandbox)
        except asyncio.CancelledError:
            if not flight.lost:
                raise
            if flight.task is not None:
                flight.task.uncancel()
            raise SandboxUnreachable(LOST) from None
        finally:
            self._untrack(sandbox, flight)

    async def _forward(
        self, request: Request, agent_url: str, path: str, stream: bool, sandbox: str
    ) -> tuple[Response, float]:
        outgoing = self.client.build_request(
            request.method,
            agent_url + path,
            params=request.query_params,
            headers=self._headers(request, sandbox),
            # A body-less request (GET files, DELETE) must not become an empty chunked body: the
            # agent would close the connection with those bytes unread, and the kernel's reset can
            # destroy the end of a large response before we read it.
            content=request.stream() if _has_body(request) else None,
        )
        started = time.monotonic()
        try:
            upstream = await self.client.send(outgoing, stream=True)
        except httpx.TransportError as error:
            raise SandboxUnreachable(
                f"the sandbox's agent did not answer ({type(error).__name__}): the sandbox is "
                "lost; release this lease and acquire another"
            ) from error
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS}
        if stream:
            relay = self._relay(upstream, sandbox)
            return (
                StreamingResponse(relay, status_code=upstream.status_code, headers=headers),
                time.monotonic() - started,
            )
        try:
            body = await upstream.aread()
        except httpx.TransportError as error:
            # The agent hung up mid-response: a clear 502, not a 503 with a traceback in our log.
            raise SandboxUnreachable(
                f"the sandbox's agent dropped the connection mid-response ({type(error).__name__}); "
                "retry, or release this lease and acquire another"
            ) from error
        finally:
            await upstream.aclose()
        elapsed = time.monotonic() - started
        return Response(body, status_code=upstream.status_code, headers=headers), elapsed

    async def _relay(self, upstream: httpx.Response, sandbox: str) -> AsyncIterator[bytes]:
        # The relay runs in the response's own task: that is the one to end if the sandbox dies.
        flight = self._track(sandbox)
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        except asyncio.CancelledError:
            if not flight.lost:
                raise
            if flight.task is not None:
                flight.task.uncancel()
            # The status line went out long ago: the stream just ends, short of its exit event.
        finally:
            self._untrack(sandbox, flight)
            await upstream.aclose()


def _has_body(request: Request) -> bool:
    length = request.headers.get("content-length")
    return "transfer-encoding" in request.headers or (length is not None and length != "0")
