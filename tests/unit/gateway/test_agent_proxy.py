"""The agent proxy: each sandbox's own token; calls to a sandbox found gone end at once, and no call
waits longer than its own timeout plus a margin."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from starlette.requests import Request

from sandfleet.core.agent_tokens import agent_token, new_fleet_key
from sandfleet.gateway.proxy import ANSWER_MARGIN_S, AgentProxy, SandboxUnreachable, answer_bound


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


async def test_the_episode_a_call_names_is_the_gateways_never_the_callers() -> None:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["x-sandfleet-episode"])
        return httpx.Response(200, json={})

    proxy = AgentProxy(new_fleet_key())
    proxy.client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/",
        "headers": [(b"x-sandfleet-episode", b"0")],  # a caller trying an ended episode's number
        "query_string": b"",
    }
    await proxy.forward(Request(scope), "http://agent", "/v1/exec", sandbox="sb-a", episode=3)
    await proxy.close()
    assert seen == ["3"]


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


def test_a_call_is_waited_for_its_own_timeout_plus_a_margin_only() -> None:
    margin = ANSWER_MARGIN_S
    assert answer_bound(b'{"argv": ["x"], "timeout_s": 5}', None, 300.0) == 5 + margin
    assert answer_bound(b'{"argv": ["x"]}', None, 300.0) == 300 + margin
    assert answer_bound(None, "30", None) == 30 + margin
    assert answer_bound(b"not json", None, 1800.0) == 1800 + margin
    assert answer_bound(b'{"timeout_s": "soon"}', None, 300.0) == 300 + margin
    assert answer_bound(b'{"timeout_s": true}', None, 300.0) == 300 + margin
    assert answer_bound(None, "inf", None) is None
    assert answer_bound(None, None, None) is None


async def test_an_agent_refusal_reaches_the_caller_as_a_problem() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/files/archive":
            return httpx.Response(404, json={"error": {"code": "file_not_found", "message": "no such: 'x'"}})
        return httpx.Response(418, content=b"not json")

    proxy = AgentProxy(new_fleet_key())
    proxy.client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    # A streamed route's refusal is reshaped too: it is one small body, not a stream.
    refused, _ = await proxy.forward(
        _request(), "http://agent", "/v1/files/archive", stream=True, sandbox="a"
    )
    assert refused.status_code == 404
    assert json.loads(bytes(refused.body)) == {
        "error": "file_not_found",
        "detail": "no such: 'x'",
        "source": "sandbox",
    }
    other, _ = await proxy.forward(_request(), "http://agent", "/v1/other", sandbox="a")
    assert (other.status_code, bytes(other.body)) == (418, b"not json")
    await proxy.close()
