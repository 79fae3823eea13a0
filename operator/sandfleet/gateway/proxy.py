"""The data plane: forwards exec, jobs, files and evaluate to the leased sandbox's agent.

Each request carries the sandbox's own agent token (derived from the fleet key, which only the
gateway and the sandboxes' creator hold). A request to a sandbox that is known to be gone (its
Pod terminating, its local runsc process dead) ends at once with `sandbox_lost`, in flight or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncIterator

import httpx
from fastapi import Request, Response
from fastapi.responses import StreamingResponse

from sandfleet.core.agent_tokens import agent_token
from sandfleet.core.model import SandboxPod
from sandfleet.wire import FROM_SANDBOX

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
# The episode a call belongs to is the gateway's to say (its agent refuses calls of an ended one).
EPISODE_HEADER = "x-sandfleet-episode"
REQUEST_DROP = (HOP_HEADERS - {"content-length"}) | {EPISODE_HEADER}


# How long past a call's own timeout the agent may take to answer before its sandbox counts as lost
# (a frozen or partitioned sandbox sends no reset): the agent ends the command at its timeout.
ANSWER_MARGIN_S = 30.0
# The agent's default timeouts where a body may set its own `timeout_s` (docs/agent-api.md).
DEFAULT_TIMEOUTS = {"/v1/exec": 300.0, "/v1/exec/stream": 300.0, "/v1/evaluate": 1800.0}
# Bodies up to this size are read to find their `timeout_s`; larger ones are relayed unread.
TIMEOUT_BODY_MAX = 1 << 20

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
        self.timeout = timeout
        self.write_timeout = write_timeout
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

    def on_change(self, sandbox: SandboxPod) -> None:
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

    def agent_headers(self, sandbox_name: str, episode: int) -> dict[str, str]:
        """What every call to a sandbox's agent carries: its own token, and the lease's episode."""
        headers = {EPISODE_HEADER: str(episode)}
        if self.agent_key is not None:
            headers["authorization"] = f"Bearer {agent_token(self.agent_key, sandbox_name)}"
        return headers

    def _headers(self, request: Request, sandbox_name: str, episode: int) -> dict[str, str]:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in REQUEST_DROP}
        if "transfer-encoding" in request.headers:
            headers.pop("content-length", None)
        return headers | self.agent_headers(sandbox_name, episode)

    async def forward(
        self,
        request: Request,
        agent_url: str,
        path: str,
        stream: bool = False,
        sandbox: str = "",
        episode: int = 0,
    ) -> tuple[Response, float]:
        """Send the caller's request to sandbox `sandbox` at `agent_url + path`; response, agent time."""
        flight = self._track(sandbox)
        try:
            return await self._forward(request, agent_url, path, stream, sandbox, episode)
        except asyncio.CancelledError:
            if not flight.lost:
                raise
            if flight.task is not None:
                flight.task.uncancel()
            raise SandboxUnreachable(LOST) from None
        finally:
            self._untrack(sandbox, flight)

    async def _forward(
        self, request: Request, agent_url: str, path: str, stream: bool, sandbox: str, episode: int
    ) -> tuple[Response, float]:
        content, answer_within = await _content_and_bound(request, path)
        read = self.timeout if answer_within is None else min(self.timeout, answer_within)
        outgoing = self.client.build_request(
            request.method,
            agent_url + path,
            params=request.query_params,
            headers=self._headers(request, sandbox, episode),
            content=content,
            timeout=httpx.Timeout(self.timeout, connect=5.0, write=self.write_timeout, read=read),
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
        if stream and upstream.status_code >= 400:
            stream = False  # a refusal is one small JSON body: read it, so it can be reshaped below
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
        if upstream.status_code >= 400:
            body, headers = as_problem(body, headers)
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


async def _content_and_bound(
    request: Request, path: str
) -> tuple[bytes | AsyncIterator[bytes] | None, float | None]:
    """The body to relay, and how long the agent may take to answer (None: as long as the proxy allows)."""
    query_timeout = answer_bound(None, request.query_params.get("timeout_s"), None)
    # A body-less request (GET files, DELETE) must not become an empty chunked body: the agent
    # would close the connection with those bytes unread, and the kernel's reset can destroy the
    # end of a large response before we read it.
    if not _has_body(request):
        return None, query_timeout
    default = DEFAULT_TIMEOUTS.get(path)
    length = request.headers.get("content-length", "")
    if default is None or not length.isdigit() or int(length) > TIMEOUT_BODY_MAX:
        return request.stream(), query_timeout
    body = await request.body()
    return body, answer_bound(body, None, default)


def answer_bound(body: bytes | None, query_timeout: str | None, default: float | None) -> float | None:
    """A call's own timeout plus ANSWER_MARGIN_S; None when it has none.

    The timeout is the body's `timeout_s`, else the query's, else the agent's default for the route.
    """
    given: object = query_timeout
    if body is not None:
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and parsed.get("timeout_s") is not None:
            given = parsed["timeout_s"]
    seconds = default
    if isinstance(given, str | int | float) and not isinstance(given, bool):
        with contextlib.suppress(ValueError):
            seconds = float(given)
    if seconds is None or not math.isfinite(seconds):
        return None
    return max(seconds, 0.0) + ANSWER_MARGIN_S


def as_problem(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    """An agent's refusal (`{"error": {"code", "message"}}`) in the gateway's Problem shape.

    Clients see one error shape on every route: `error` (the agent's stable code), `detail` (its
    message) and `source: "sandbox"`, which tells a refusal from inside the sandbox (a 404 for a
    missing file) from the gateway's own (a 404 for a missing lease). Anything else passes as it is.
    """
    try:
        parsed = json.loads(body)
    except ValueError:
        return body, headers
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict):
        return body, headers
    problem = {
        "error": str(error.get("code") or "sandbox_error"),
        "detail": str(error.get("message") or "the sandbox refused the request"),
        "source": FROM_SANDBOX,
    }
    headers = {k: v for k, v in headers.items() if k.lower() not in {"content-type", "content-encoding"}}
    headers["content-type"] = "application/json"
    return json.dumps(problem, separators=(",", ":")).encode(), headers


def _has_body(request: Request) -> bool:
    length = request.headers.get("content-length")
    return "transfer-encoding" in request.headers or (length is not None and length != "0")
