"""The front door over plain ASGI: no body byte is read before auth, caps are per route, stalls are cut."""

from __future__ import annotations

import asyncio

from starlette.types import Message, Receive, Scope, Send

from sandfleet.gateway.auth import Authenticator, Caller
from sandfleet.gateway.guard import BodyLimits, Guard

AUTH = Authenticator(static_tokens={"t": Caller("alice")})


def scope(path: str, method: str = "POST", token: str | None = "t", length: int | None = None) -> Scope:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http", "method": method, "path": path, "headers": headers}


async def reading_app(scope: Scope, receive: Receive, send: Send) -> None:
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def call(guard: Guard, asgi_scope: Scope, chunks: list[bytes], pause: float = 0.0) -> tuple[int, int]:
    """The status answered, and how many body chunks were read."""
    read = 0
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal read
        if read < len(chunks):
            await asyncio.sleep(pause)
            read += 1
            return {"type": "http.request", "body": chunks[read - 1], "more_body": read < len(chunks)}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await guard(asgi_scope, receive, send)
    return next(m["status"] for m in sent if m["type"] == "http.response.start"), read


def test_routes_get_their_own_caps() -> None:
    limits = BodyLimits(control=1, agent=2, upload=3)
    assert limits.cap("POST", "/v1/leases") == 1
    assert limits.cap("POST", "/v1/runs/r/spans") == 1
    assert limits.cap("POST", "/v1/leases/ns.sb/exec") == 2
    assert limits.cap("POST", "/v1/leases/ns.sb/evaluate") == 2
    assert limits.cap("PUT", "/v1/leases/ns.sb/files") == 3
    assert limits.cap("PUT", "/v1/leases/ns.sb/files/archive") == 3


async def test_no_body_is_read_without_a_valid_token() -> None:
    guard = Guard(reading_app, AUTH, BodyLimits())
    assert await call(guard, scope("/v1/leases", token=None), [b"x"] * 100) == (401, 0)
    assert await call(guard, scope("/v1/leases", token="wrong"), [b"x"] * 100) == (401, 0)
    assert await call(guard, scope("/healthz", method="GET", token=None), [b""]) == (200, 1)


async def test_a_declared_length_over_the_cap_is_refused_unread_and_a_streamed_one_when_it_passes() -> None:
    guard = Guard(reading_app, AUTH, BodyLimits(control=1024))
    assert await call(guard, scope("/v1/leases", length=2048), [b"x" * 2048]) == (413, 0)
    assert await call(guard, scope("/v1/leases"), [b"x" * 512] * 10) == (413, 3)
    assert await call(guard, scope("/v1/leases"), [b"x" * 512] * 2) == (200, 2)


async def test_a_stalled_body_is_cut_off() -> None:
    guard = Guard(reading_app, AUTH, BodyLimits(idle_seconds=0.05))
    assert (await call(guard, scope("/v1/leases"), [b"x"] * 3, pause=0.2))[0] == 408
