"""The blocking client is the async one on a private loop: same calls, same retries, any httpx transport."""

from __future__ import annotations

import gzip
import json
import threading

import httpx
import pytest

from sandfleet.client import AsyncFleet, Fleet, Lease, Sandbox, SandboxLost, Unavailable
from sandfleet.wire import FRESH_KEY_HEADER

LEASE = {"id": "l1", "pool": "python", "sandbox": "sb-1", "region": "us", "expires_at": 1.0, "labels": {}}


class Gateway:
    """Answers like the gateway; the first `unavailable` requests get a 503."""

    def __init__(self, unavailable: int = 0) -> None:
        self.unavailable = unavailable
        self.seen: list[str] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(f"{request.method} {request.url.path}")
        if self.unavailable:
            self.unavailable -= 1
            return httpx.Response(503, json={"error": "unavailable", "detail": "try again"})
        path = request.url.path
        if path == "/v1/leases" and request.method == "POST":
            count = json.loads(request.content)["count"]
            return httpx.Response(200, json={"leases": [{**LEASE, "id": f"l{i}"} for i in range(count)]})
        if path.endswith("/files/list"):
            return httpx.Response(200, json={"entries": []})
        if path.endswith("/renew"):
            return httpx.Response(200, json={"lease": {**LEASE, "expires_at": 2.0}})
        if path.endswith("/exec"):
            return httpx.Response(502, json={"error": "sandbox_lost", "detail": "gone"})
        if request.method == "DELETE":
            return httpx.Response(200, json={"released": True})
        return httpx.Response(200, json={"pools": [{"name": "python"}]})


class Blocking(httpx.BaseTransport):
    """A blocking-only transport that gzips its bodies, as a real server may."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self.gateway.handle(request)
        headers = {"content-type": "application/json", "content-encoding": "gzip"}
        return httpx.Response(answer.status_code, headers=headers, content=gzip.compress(answer.content))


def test_safe_calls_are_retried_through_a_503_and_others_are_not() -> None:
    gateway = Gateway(unavailable=1)
    with Fleet("http://gateway", transport=httpx.MockTransport(gateway.handle)) as fleet:
        assert [pool["name"] for pool in fleet.pools()] == ["python"]
        assert gateway.seen == ["GET /v1/pools", "GET /v1/pools"]
        sandbox = Sandbox(fleet, Lease.of(LEASE))
        with pytest.raises(SandboxLost):
            sandbox.exec(["true"])  # an exec is never repeated
        assert gateway.seen[-1] == "POST /v1/leases/l1/exec"


def test_retries_end_with_the_gateways_error() -> None:
    gateway = Gateway(unavailable=10)
    with (
        Fleet("http://gateway", retries=1, transport=httpx.MockTransport(gateway.handle)) as fleet,
        pytest.raises(Unavailable),
    ):
        fleet.pools()
    assert len(gateway.seen) == 2


async def test_the_async_client_retries_the_same_way() -> None:
    gateway = Gateway(unavailable=1)
    async with AsyncFleet("http://gateway", transport=httpx.MockTransport(gateway.handle)) as fleet:
        assert [pool["name"] for pool in await fleet.pools()] == ["python"]
    assert len(gateway.seen) == 2


def test_a_blocking_transport_works_and_bodies_are_decoded_once() -> None:
    gateway = Gateway()
    with Fleet("http://gateway", transport=Blocking(gateway)) as fleet:
        assert [pool["name"] for pool in fleet.pools()] == ["python"]
        with fleet.lease("python") as sandbox:
            assert sandbox.list_files() == {"entries": []}
            assert sandbox.renew().expires_at == 2.0
            assert sandbox.lease.expires_at == 2.0
    assert gateway.seen[-1] == "DELETE /v1/leases/l0"


def test_a_group_is_released_whatever_happens_inside() -> None:
    gateway = Gateway()
    leased: list[str] = []

    def episode(fleet: Fleet) -> None:
        with fleet.group("python", 2) as sandboxes:
            leased.extend(s.lease.id for s in sandboxes)
            raise RuntimeError("episode failed")

    with (
        Fleet("http://gateway", transport=httpx.MockTransport(gateway.handle)) as fleet,
        pytest.raises(RuntimeError, match="episode failed"),
    ):
        episode(fleet)
    assert leased == ["l0", "l1"]
    assert sorted(gateway.seen[-2:]) == ["DELETE /v1/leases/l0", "DELETE /v1/leases/l1"]


def test_closing_stops_the_private_loop_thread() -> None:
    before = {t for t in threading.enumerate() if t.name == "sandfleet-client"}
    with Fleet("http://gateway", transport=httpx.MockTransport(Gateway().handle)) as fleet:
        fleet.pools()
        assert {t for t in threading.enumerate() if t.name == "sandfleet-client"} - before
    assert {t for t in threading.enumerate() if t.name == "sandfleet-client"} == before
    fleet.close()  # a second close is harmless


def test_a_batch_asks_for_its_range_and_releases_every_lease_it_got() -> None:
    gateway = Gateway()
    bodies: list[dict[str, object]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            bodies.append(json.loads(request.content))
        return gateway.handle(request)

    with Fleet("http://gateway", transport=httpx.MockTransport(handle)) as fleet:
        with fleet.batch("python", 3, min_count=2, wait_seconds=4.0) as sandboxes:
            assert [s.lease.id for s in sandboxes] == ["l0", "l1", "l2"]
        (body,) = bodies
        assert (body["count"], body["min_count"], body["wait_seconds"]) == (3, 2, 4.0)
        assert body["idempotency_key"]  # one key for the whole batch: a retry gets the same leases
        assert sorted(gateway.seen[1:]) == [f"DELETE /v1/leases/l{i}" for i in range(3)]
        fleet.acquire("python", count=2)
        assert "min_count" not in bodies[-1]  # a group: all or nothing, as before


def test_only_the_first_try_of_a_key_the_client_made_says_it_is_fresh() -> None:
    """A key never sent before has no earlier attempt for the gateway to read back; a retry may."""
    fresh: list[str | None] = []
    gateway = Gateway(unavailable=1)

    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            fresh.append(request.headers.get(FRESH_KEY_HEADER))
        return gateway.handle(request)

    with Fleet("http://gateway", transport=httpx.MockTransport(handle)) as fleet:
        fleet.acquire("python")  # a 503, then the retry
        fleet.acquire("python", idempotency_key="episode-7")  # the caller's own key: maybe sent before
    assert fresh == ["true", None, None]
