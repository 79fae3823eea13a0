"""Nobody gets a body read before auth, and no route takes more than its cap (real gateway, real gVisor).

The gateway's resident memory is read from /proc before and after: a body that is refused must never
have been held.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.support.tenants import TOKENS, TenantGateway, tenant_gateway

pytestmark = pytest.mark.gvisor
__all__ = ["tenant_gateway"]

BIG = 200 << 20  # what the review sent: 200 MiB
CHUNK = b"x" * (1 << 20)


def chunks(total: int) -> Iterator[bytes]:
    for _ in range(total // len(CHUNK)):
        yield CHUNK


def raw_post(gateway: TenantGateway, path: str, total: int, token: str | None) -> tuple[int, bytes]:
    """POST `total` bytes as fast as the gateway reads them; its status line and what it said.

    A raw socket, so the body is sent whether or not the gateway has answered already (a client
    library would stop at the first error); sending stops once the gateway closes its side.
    """
    address = urlsplit(gateway.url)
    with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        head += f"Content-Length: {total}\r\n"
        if token:
            head += f"Authorization: Bearer {token}\r\n"
        sock.sendall((head + "\r\n").encode())
        try:
            for chunk in chunks(total):
                sock.sendall(chunk)
        except OSError:
            pass  # the gateway answered and closed: exactly what should happen early
        sock.settimeout(10)
        answer = b""
        try:
            while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
        except OSError:
            pass
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1") else 0
    return status, answer


def test_an_unauthenticated_large_body_is_refused_before_any_of_it_is_read(
    tenant_gateway: TenantGateway,
) -> None:
    before = tenant_gateway.rss_kib()
    started = time.monotonic()
    status, answer = raw_post(tenant_gateway, "/v1/leases", BIG, token=None)
    elapsed = time.monotonic() - started
    after = tenant_gateway.rss_kib()
    print(f"unauthenticated 200 MiB: RSS {before / 1024:.0f} -> {after / 1024:.0f} MiB, {elapsed:.2f} s")
    assert status == 401, answer[-500:]
    assert b"bearer token" in answer
    assert after - before < 20 * 1024, f"the gateway grew by {(after - before) / 1024:.0f} MiB"


def test_an_authenticated_body_over_a_control_routes_cap_gets_413_without_being_held(
    tenant_gateway: TenantGateway,
) -> None:
    before = tenant_gateway.rss_kib()
    status, answer = raw_post(tenant_gateway, "/v1/runs/big/spans", BIG, token=TOKENS["bob"])
    after = tenant_gateway.rss_kib()
    print(f"authenticated 200 MiB: RSS {before / 1024:.0f} -> {after / 1024:.0f} MiB")
    assert status == 413, answer[-500:]
    assert b"body_too_large" in answer
    assert after - before < 20 * 1024, f"the gateway grew by {(after - before) / 1024:.0f} MiB"


def test_a_chunked_body_over_the_cap_is_cut_off_with_413(tenant_gateway: TenantGateway) -> None:
    address = urlsplit(tenant_gateway.url)
    with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/runs/chunky/spans HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nAuthorization: Bearer " + TOKENS["bob"].encode() + b"\r\n\r\n"
        )
        try:
            for _ in range(8):  # 8 MiB against a 1 MiB cap, without a declared length
                sock.sendall(b"%x\r\n" % len(CHUNK) + CHUNK + b"\r\n")
        except OSError:
            pass
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]


def test_a_body_that_stalls_is_cut_off(tenant_gateway: TenantGateway) -> None:
    address = urlsplit(tenant_gateway.url)
    with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/runs/slow/spans HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\nAuthorization: Bearer " + TOKENS["bob"].encode() + b"\r\n\r\n{"
        )
        started = time.monotonic()
        answer = sock.recv(65536)
        elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert elapsed < 2 + 3  # SANDFLEET_GATEWAY_BODY_IDLE_SECONDS=2 in the fixture
