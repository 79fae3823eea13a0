"""A request's work is called off when its client hangs up, and only then."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from sandfleet.gateway.disconnect import ClientGone, unless_disconnected


def request_that_hangs_up(hang_up: asyncio.Event) -> Request:
    async def receive() -> dict[str, Any]:
        await hang_up.wait()
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)


async def test_the_work_is_cancelled_when_the_client_hangs_up() -> None:
    hang_up = asyncio.Event()
    cleaned_up = asyncio.Event()

    async def work() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.01)  # its cleanup finishes before the caller hears ClientGone
            cleaned_up.set()
            raise
        return "never"

    call = asyncio.create_task(unless_disconnected(request_that_hangs_up(hang_up), work()))
    await asyncio.sleep(0.01)
    hang_up.set()
    with pytest.raises(ClientGone):
        await call
    assert cleaned_up.is_set()


async def test_finished_work_is_returned_and_its_errors_pass_through() -> None:
    hang_up = asyncio.Event()

    async def answer() -> int:
        await asyncio.sleep(0.01)
        return 42

    async def fail() -> int:
        raise LookupError("no such pool")

    assert await unless_disconnected(request_that_hangs_up(hang_up), answer()) == 42
    with pytest.raises(LookupError):
        await unless_disconnected(request_that_hangs_up(hang_up), fail())
