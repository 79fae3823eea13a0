"""The data plane: forwards exec, jobs, files and evaluate to the leased sandbox's agent."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import httpx
from fastapi import Request, Response
from fastapi.responses import StreamingResponse

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


class SandboxUnreachable(ConnectionError):
    """The leased sandbox's agent did not answer: the sandbox is lost."""


class AgentProxy:
    """One pooled HTTP client to every agent (keep-alive makes an exec a single round trip)."""

    def __init__(
        self, agent_token: str | None = None, timeout: float = 3600.0, write_timeout: float = 60.0
    ) -> None:
        self.agent_token = agent_token
        self.client = httpx.AsyncClient(
            # A write that makes no progress for a minute means the sandbox died under it (an upload
            # that filled its memory kills it silently: its netstack goes with it, so no reset comes).
            # Without this bound the caller would hang for the hour an exec may take, not get a 502.
            timeout=httpx.Timeout(timeout, connect=5.0, write=write_timeout),
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
        )

    async def close(self) -> None:
        await self.client.aclose()

    def _headers(self, request: Request) -> dict[str, str]:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in REQUEST_DROP}
        if "transfer-encoding" in request.headers:
            headers.pop("content-length", None)
        if self.agent_token:
            headers["authorization"] = f"Bearer {self.agent_token}"
        return headers

    async def forward(
        self, request: Request, agent_url: str, path: str, stream: bool = False
    ) -> tuple[Response, float]:
        """Send the caller's request to `agent_url + path`; the response and the agent's time."""
        outgoing = self.client.build_request(
            request.method,
            agent_url + path,
            params=request.query_params,
            headers=self._headers(request),
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
            return (
                StreamingResponse(_relay(upstream), status_code=upstream.status_code, headers=headers),
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


def _has_body(request: Request) -> bool:
    length = request.headers.get("content-length")
    return "transfer-encoding" in request.headers or (length is not None and length != "0")


async def _relay(upstream: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    finally:
        await upstream.aclose()
