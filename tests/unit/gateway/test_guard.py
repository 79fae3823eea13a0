"""The front door over plain ASGI: no body byte is read before auth, caps are per route, stalls are cut."""

from __future__ import annotations

import asyncio

from starlette.types import Message, Receive, Scope, Send

from sandfleet.gateway.auth import Authenticator, Caller
from sandfleet.gateway.guard import BodyLimits, Guard, is_multipart, streamed

AUTH = Authenticator(static_tokens={"t": Caller("alice")})


def scope(
    path: str,
    method: str = "POST",
    token: str | None = "t",
    length: int | None = None,
    content_type: str = "",
) -> Scope:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    if content_type:
        headers.append((b"content-type", content_type.encode()))
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
    # E2B's envd upload: one octet-stream file streams through like ours; multipart is parsed, buffered
    assert limits.cap("POST", "/e2b/envd/files", "application/octet-stream") == 3
    assert limits.cap("POST", "/e2b/envd/files", "") == 3
    assert limits.cap("POST", "/e2b/envd/files", "Multipart/Form-Data; boundary=x") == 2
    assert limits.cap("GET", "/e2b/envd/files") == 1
    assert limits.cap("POST", "/e2b/envd/files/x", "application/octet-stream") == 1
    assert limits.cap("POST", "/e2b/v2/sandboxes", "application/octet-stream") == 1


def test_multipart_and_streamed_routes_are_told_apart() -> None:
    assert is_multipart("multipart/form-data; boundary=abc")
    assert is_multipart(" MULTIPART/FORM-DATA")
    assert not is_multipart("application/octet-stream")
    assert not is_multipart("multipart/mixed")
    assert not is_multipart("")
    assert streamed("/e2b/envd/files")
    assert streamed("/v1/leases/ns.sb/files")
    assert not streamed("/e2b/envd/filesystem.Filesystem/ListDir")
    assert not streamed("/v1/leases")


async def test_an_e2b_upload_gets_the_upload_cap_unless_it_is_multipart() -> None:
    guard = Guard(reading_app, AUTH, BodyLimits(control=1024, agent=2048, upload=4096))
    octets = scope("/e2b/envd/files", content_type="application/octet-stream")
    assert await call(guard, octets, [b"x" * 1024] * 4) == (200, 4)
    assert await call(guard, octets, [b"x" * 1024] * 6) == (413, 5)
    form = scope("/e2b/envd/files", content_type="multipart/form-data; boundary=b")
    assert await call(guard, form, [b"x" * 1024] * 2) == (200, 2)
    assert await call(guard, form, [b"x" * 1024] * 3) == (413, 3)
    declared = scope("/e2b/envd/files", length=8192, content_type="application/octet-stream")
    assert await call(guard, declared, [b"x" * 8192]) == (413, 0)


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


async def test_an_e2b_upload_may_take_longer_than_the_idle_bound_if_it_never_pauses_that_long() -> None:
    guard = Guard(reading_app, AUTH, BodyLimits(idle_seconds=0.2))
    upload = scope("/e2b/envd/files", content_type="application/octet-stream")
    assert await call(guard, upload, [b"x"] * 6, pause=0.05) == (200, 6)
    assert (await call(guard, scope("/v1/leases"), [b"x"] * 6, pause=0.05))[0] == 408
    assert (await call(guard, upload, [b"x"] * 3, pause=0.4))[0] == 408
