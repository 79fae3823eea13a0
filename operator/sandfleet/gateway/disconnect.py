"""Call off a request's work when its HTTP client hangs up (a queued acquire must not outlive it)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.requests import Request

T = TypeVar("T")


class ClientGone(Exception):
    """The client closed the connection before the answer was ready; the work was cancelled."""


async def unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """Run `work`; if the client disconnects first, cancel it (it cleans up) and raise ClientGone.

    The body has been read by then, so the next ASGI message can only be `http.disconnect`:
    waiting for it costs no polling, and the work hears of the hang-up at once.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})  # its cleanup (leaving the queue, un-claiming) is done
    if task.cancelled() and watcher.done() and not watcher.cancelled():
        raise ClientGone("the client disconnected before a sandbox was leased")
    return task.result()


async def _disconnected(request: Request) -> None:
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception:
        # A server whose receive cannot be awaited again: never a reason to call the work off.
        await asyncio.Event().wait()
