"""Slowloris: half-sent requests are closed within the header timeout, and one address has a connection cap.

Raw sockets against a real `sandfleet serve --local` (real gVisor), whose fixture sets
SANDFLEET_GATEWAY_HEADER_TIMEOUT_SECONDS=2 and SANDFLEET_GATEWAY_MAX_CONNECTIONS_PER_CLIENT=40.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.tenants import SETTINGS, TenantGateway, tenant_gateway

pytestmark = pytest.mark.gvisor
__all__ = ["tenant_gateway"]

HEADER_TIMEOUT = float(SETTINGS["SANDFLEET_GATEWAY_HEADER_TIMEOUT_SECONDS"])
CAP = int(SETTINGS["SANDFLEET_GATEWAY_MAX_CONNECTIONS_PER_CLIENT"])
ATTACKER = "127.0.0.2"  # another client address on loopback


def connect(gateway: TenantGateway, source: str = "127.0.0.1") -> socket.socket:
    address = urlsplit(gateway.url)
    sock = socket.create_connection(
        (address.hostname, address.port), timeout=HEADER_TIMEOUT + 5, source_address=(source, 0)
    )
    return sock


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the gateway closed `sock` within `seconds`, and what it said first."""
    sock.settimeout(seconds)
    said = b""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True, said
            said += data
    except TimeoutError:
        return False, said
    except ConnectionResetError:
        return True, said


@contextlib.contextmanager
def half_open(gateway: TenantGateway, count: int, source: str) -> Iterator[list[socket.socket]]:
    """`count` connections from `source`, each with half a request's headers sent."""
    socks = []
    try:
        for _ in range(count):
            sock = connect(gateway, source)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def test_connections_with_half_sent_headers_are_closed_within_the_header_timeout(
    tenant_gateway: TenantGateway,
) -> None:
    started = time.monotonic()
    with half_open(tenant_gateway, 10, ATTACKER) as socks:
        silent = connect(tenant_gateway, ATTACKER)  # connected and sent nothing at all
        results = [closed_within(sock, HEADER_TIMEOUT + 3) for sock in [*socks, silent]]
        silent.close()
    elapsed = time.monotonic() - started
    assert all(closed for closed, _ in results), f"{sum(not c for c, _ in results)} still open"
    assert elapsed < HEADER_TIMEOUT + 3
    assert results[0][1].startswith(b"HTTP/1.1 408"), results[0][1][:200]


def test_an_address_over_its_connection_cap_is_refused_while_another_client_is_served(
    tenant_gateway: TenantGateway,
) -> None:
    with half_open(tenant_gateway, CAP, ATTACKER):
        over = connect(tenant_gateway, ATTACKER)
        closed, said = closed_within(over, 2)
        over.close()
        assert closed, "a connection over the cap was kept open"
        assert b"too_many_connections" in said, said[:300]
        # Someone else, meanwhile, is served at once.
        started = time.monotonic()
        with httpx.Client(base_url=tenant_gateway.url, timeout=5, trust_env=False) as client:
            assert client.get("/healthz").status_code == 200
        assert time.monotonic() - started < 1
