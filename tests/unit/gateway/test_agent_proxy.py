"""The agent proxy: each sandbox's own token, and calls to a sandbox found gone end at once."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from starlette.requests import Request

from sandfleet.core.agent_tokens import agent_token, new_fleet_key
from sandfleet.gateway.proxy import AgentProxy, SandboxUnreachable


def _request() -> Request:
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""}
    return Request(scope)


async def test_each_sandbox_gets_its_own_token() -> None:
    key = new_fleet_key()
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["authorization"])
        return httpx.Response(200, json={})

    proxy = AgentProxy(key)
    proxy.client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    for name in ("sb-a", "sb-b"):
        response, _ = await proxy.forward(_request(), "http://agent", "/v1/health", sandbox=name)
        assert response.status_code == 200
    await proxy.close()
    assert seen == [f"Bearer {agent_token(key, 'sb-a')}", f"Bearer {agent_token(key, 'sb-b')}"]


async def test_a_call_to_a_sandbox_found_lost_ends_at_once() -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(3600)  # a dead peer: no answer, no reset
        return httpx.Response(200)

    proxy = AgentProxy(new_fleet_key())
    proxy.client = httpx.AsyncClient(transport=httpx.MockTransport(hang))
    call = asyncio.create_task(proxy.forward(_request(), "http://agent", "/v1/exec", sandbox="sb-a"))
    bystander = asyncio.create_task(proxy.forward(_request(), "http://agent", "/v1/exec", sandbox="sb-b"))
    await asyncio.sleep(0.05)
    started = time.monotonic()
    proxy.lost("sb-a")
    with pytest.raises(SandboxUnreachable, match="lost"):
        await call
    assert time.monotonic() - started < 1
    assert not bystander.done()  # only the lost sandbox's calls end
    bystander.cancel()
    with pytest.raises(asyncio.CancelledError):
        await bystander
    await proxy.close()
