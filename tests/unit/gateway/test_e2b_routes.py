"""The E2B API's edges over an in-memory fleet: the SDK's credentials, tenants, and E2B's error shape.

The SDK itself, against real sandboxes, is tests/e2e/local/test_e2b_compat.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from sandfleet.core import e2b
from sandfleet.gateway.app import Runtime, create_app
from sandfleet.gateway.auth import Authenticator, Caller
from sandfleet.gateway.routes.e2b import with_message
from tests.support.backends import POOL, MemoryBackend

MINE, THEIRS = "key-mine", "key-theirs"


async def noop() -> None:
    return None


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    backend = MemoryBackend()
    for name in ("s0", "s1"):
        backend.add(name)
    tokens = {MINE: Caller("actor-0"), THEIRS: Caller("actor-1")}
    runtime = Runtime(backend, Authenticator(static_tokens=tokens), ready=lambda: True, start=noop, stop=noop)
    transport = httpx.ASGITransport(app=create_app(runtime))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        yield http


def as_sdk(key: str) -> dict[str, str]:
    """The headers the SDK sends to the API."""
    return {"X-API-KEY": key}


async def test_create_is_a_lease_and_gives_back_the_callers_key_for_envd(client: httpx.AsyncClient) -> None:
    created = await client.post(
        "/e2b/v2/sandboxes",
        json={"templateID": POOL.name, "timeout": 77, "metadata": {"episode": "9"}},
        headers=as_sdk(MINE),
    )
    assert created.status_code == 201, created.text
    answer = created.json()
    assert answer["envdAccessToken"] == MINE
    assert answer["templateID"] == POOL.name
    lease = await client.get(f"/v1/leases/{answer['sandboxID']}", headers={"Authorization": f"Bearer {MINE}"})
    assert lease.json()["lease"]["ttl_seconds"] == 77
    assert lease.json()["lease"]["labels"] == {"episode": "9", e2b.TEMPLATE_LABEL: POOL.name}


async def test_another_tenants_key_reaches_nothing(client: httpx.AsyncClient) -> None:
    created = await client.post("/e2b/sandboxes", json={"templateID": POOL.name}, headers=as_sdk(MINE))
    sandbox = created.json()["sandboxID"]
    for method, path, body in [
        ("GET", f"/e2b/sandboxes/{sandbox}", None),
        ("POST", f"/e2b/sandboxes/{sandbox}/timeout", {"timeout": 5}),
        ("POST", f"/e2b/v2/sandboxes/{sandbox}/connect", {"timeout": 5}),
        ("DELETE", f"/e2b/sandboxes/{sandbox}", None),
    ]:
        refused = await client.request(method, path, json=body, headers=as_sdk(THEIRS))
        assert refused.status_code == 403, (method, path, refused.text)
        assert refused.json()["message"] == f"lease {sandbox!r} belongs to another caller"
    assert (await client.get(f"/e2b/sandboxes/{sandbox}", headers=as_sdk(MINE))).status_code == 200
    assert (await client.delete(f"/e2b/sandboxes/{sandbox}", headers=as_sdk(MINE))).status_code == 204
    again = await client.delete(f"/e2b/sandboxes/{sandbox}", headers=as_sdk(MINE))
    assert again.status_code == 404  # the SDK's kill() reads this as False


async def test_credentials_are_the_sdks_headers_only(client: httpx.AsyncClient) -> None:
    # no key: 401 with E2B's message; a Basic user header (the SDK's `user=`) is no credential
    missing = await client.post("/e2b/sandboxes", json={"templateID": POOL.name})
    assert missing.status_code == 401
    assert missing.json()["code"] == 401
    assert missing.json()["message"]
    basic = await client.get(
        "/e2b/envd/files", params={"path": "a"}, headers={"Authorization": "Basic dXNlcjo="}
    )
    assert basic.status_code == 401
    # the API key is not the envd credential, nor the other way round
    assert (await client.get("/e2b/envd/health", headers=as_sdk(MINE))).status_code == 401
    wrong_way = await client.get("/e2b/sandboxes/x", headers={"X-Access-Token": MINE})
    assert wrong_way.status_code == 401
    # outside /e2b the SDK's headers mean nothing
    assert (await client.get("/v1/leases", headers=as_sdk(MINE))).status_code == 401


async def test_bad_create_bodies_are_one_line_400s(client: httpx.AsyncClient) -> None:
    for body in (
        {"templateID": "no-such-pool"},
        {"templateID": POOL.name, "timeout": 0},
        {"templateID": POOL.name, "envVars": {"A": "1"}},
    ):
        refused = await client.post("/e2b/sandboxes", json=body, headers=as_sdk(MINE))
        assert refused.status_code in (400, 404), refused.text
        assert "\n" not in refused.json()["message"]


async def test_envd_without_the_sandbox_header_is_a_400(client: httpx.AsyncClient) -> None:
    response = await client.get("/e2b/envd/health", headers={"X-Access-Token": MINE})
    assert response.status_code == 400
    assert "E2b-Sandbox-Id" in response.json()["message"]


def test_with_message_adds_e2b_fields_to_problems_only() -> None:
    assert (
        with_message(b'{"error":"x","detail":"why"}', 404)
        == b'{"error": "x", "detail": "why", "code": 404, "message": "why"}'
    )
    kept = b'{"code":"not_found","message":"m"}'
    assert with_message(kept, 404) == kept
    assert with_message(b"not json", 500) == b"not json"
