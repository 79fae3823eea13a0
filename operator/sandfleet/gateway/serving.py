"""The gateway's HTTP protocol for uvicorn: a header timeout and a cap on connections per client address."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sandfleet.gateway.settings import TenantSettings


def _raw_response(status: str, error: str, detail: str) -> bytes:
    body = json.dumps({"error": error, "detail": detail}).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol, plus two bounds uvicorn does not have.

    uvicorn times out idle keep-alive connections, but not a connection that is still sending its
    request's headers (or has sent nothing yet): a slowloris client holds a file descriptor per
    half-sent request forever. Here a request's headers must be complete `header_timeout` seconds
    after its first byte (or after the connection opened), and one client address holds at most
    `max_per_client` connections; the ones over it get a 503 and are closed. (The body's own pace
    is bounded in the ASGI guard, which knows the route.)
    """

    header_timeout: float = 10.0
    max_per_client: int = 0  # 0: no cap
    open_by_client: ClassVar[Counter[str]] = Counter()  # each server gets its own subclass

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._counted: str | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if self.max_per_client and self.open_by_client[address] >= self.max_per_client:
            self._refused = True
            self.transport = transport
            detail = f"this address has {self.max_per_client} connections open already: reuse them"
            transport.write(_raw_response("503 Service Unavailable", "too_many_connections", detail))
            transport.close()
            return
        self.open_by_client[address] += 1
        self._counted = address
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._disarm()
        if self._counted is not None:
            self.open_by_client[self._counted] -= 1
            if self.open_by_client[self._counted] <= 0:
                del self.open_by_client[self._counted]
            self._counted = None
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()  # a keep-alive connection's next request: its headers are on the clock too

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            self._arm()  # a response is still going out (a pipelined request waits behind it)
            return
        if not self.transport.is_closing():
            detail = f"the request's headers took longer than {self.header_timeout:g} s"
            self.transport.write(_raw_response("408 Request Timeout", "header_timeout", detail))
            self.transport.close()


def guarded_protocol(settings: TenantSettings) -> type[GuardedProtocol]:
    """The `http=` for uvicorn: a protocol class with the settings' bounds and its own per-address counts."""
    attributes = {
        "header_timeout": settings.header_timeout_seconds,
        "max_per_client": settings.max_connections_per_client,
        "open_by_client": Counter(),
    }
    return type("GatewayProtocol", (GuardedProtocol,), attributes)
