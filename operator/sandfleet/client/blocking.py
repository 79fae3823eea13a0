"""The blocking client: `Fleet` and `Sandbox`, the async client run on a private event-loop thread.

Every call is the async one (`async_fleet.py`), run to its end: `_blocking` makes each method's
blocking twin, so no call is written twice.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from pathlib import Path
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, cast

import httpx

from sandfleet.client.async_fleet import AsyncFleet, AsyncSandbox
from sandfleet.client.results import Lease

T = TypeVar("T")
P = ParamSpec("P")
A = TypeVar("A")


class _LoopThread:
    """A private event loop on a daemon thread, where a blocking client runs its async twin."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sandfleet-client", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # an interrupted caller does not leave its call running
            raise

    def stop(self) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)

    def close(self) -> None:
        self.stop()
        self._thread.join()
        self.loop.close()


class _Blocking(Generic[A]):
    """A blocking face over the async object `_async`."""

    _async: A

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError


def _blocking(
    method: Callable[Concatenate[A, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[_Blocking[A], P], T]:
    """The blocking twin of an async method: the same call, run to its end on the private loop."""

    @functools.wraps(method)
    def run(self: _Blocking[A], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(method(self._async, *args, **kwargs))

    return run


class _ThreadedTransport(httpx.AsyncBaseTransport):
    """A blocking httpx transport (passed to `Fleet`) driven from the private loop."""

    def __init__(self, transport: httpx.BaseTransport) -> None:
        self.transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        def send() -> httpx.Response:
            response = self.transport.handle_request(request)
            stream = cast(httpx.SyncByteStream, response.stream)  # what a blocking transport answers with
            try:
                # The stream's raw bytes, so the async client decodes them once, as the blocking one would.
                raw = b"".join(stream)
            finally:
                stream.close()
            return httpx.Response(
                response.status_code, headers=response.headers, content=raw, extensions=response.extensions
            )

        return await asyncio.to_thread(send)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.transport.close)


class Fleet(_Blocking[AsyncFleet]):
    """Blocking client for one gateway, with the same calls as AsyncFleet (which it runs)."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        timeout: float = 660.0,
        retries: int = 3,
        transport: httpx.BaseTransport | None = None,
        token_file: str | Path | None = None,
    ) -> None:
        self._loop = _LoopThread()
        # A Fleet dropped without close stops its loop rather than keep a thread per instance.
        weakref.finalize(self, self._loop.stop)
        sender = (
            transport
            if transport is None or isinstance(transport, httpx.AsyncBaseTransport)
            else _ThreadedTransport(transport)
        )

        async def make() -> AsyncFleet:
            return AsyncFleet(url, token, timeout, retries, sender, token_file)

        self._async = self._run(make())

    @property
    def retries(self) -> int:
        return self._async.retries

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self._loop.run(coroutine)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections and stop the private loop."""
        if not self._loop.loop.is_closed():
            self._run(self._async.http.aclose())
            self._loop.close()

    @contextmanager
    def _entered(self, manager: AbstractAsyncContextManager[T]) -> Iterator[T]:
        """Enter and exit an async context manager on the private loop."""
        value = self._run(manager.__aenter__())
        try:
            yield value
        except BaseException as error:
            if not self._run(manager.__aexit__(type(error), error, error.__traceback__)):
                raise
        else:
            self._run(manager.__aexit__(None, None, None))

    @contextmanager
    def lease(self, pool: str, **options: Any) -> Iterator[Sandbox]:
        """One sandbox for one episode; released on exit, whatever happened inside."""
        with self._entered(self._async.lease(pool, **options)) as sandbox:
            yield Sandbox(self, sandbox.lease)

    @contextmanager
    def group(self, pool: str, count: int, **options: Any) -> Iterator[list[Sandbox]]:
        """`count` sandboxes at once, all or nothing (a GRPO group); released on exit."""
        with self._entered(self._async.group(pool, count, **options)) as sandboxes:
            yield [Sandbox(self, sandbox.lease) for sandbox in sandboxes]

    @contextmanager
    def batch(self, pool: str, count: int, min_count: int = 1, **options: Any) -> Iterator[list[Sandbox]]:
        """Up to `count` sandboxes for a step, at least `min_count`, in `wait_seconds`; released on exit."""
        with self._entered(self._async.batch(pool, count, min_count, **options)) as sandboxes:
            yield [Sandbox(self, sandbox.lease) for sandbox in sandboxes]

    call = _blocking(AsyncFleet.call)
    acquire = _blocking(AsyncFleet.acquire)
    release = _blocking(AsyncFleet.release)
    release_run = _blocking(AsyncFleet.release_run)
    renew = _blocking(AsyncFleet.renew)
    leases = _blocking(AsyncFleet.leases)
    pools = _blocking(AsyncFleet.pools)
    publish_policy = _blocking(AsyncFleet.publish_policy)
    policy = _blocking(AsyncFleet.policy)
    report_spans = _blocking(AsyncFleet.report_spans)
    profile = _blocking(AsyncFleet.profile)


class Sandbox(_Blocking[AsyncSandbox]):
    """A leased sandbox (blocking calls), with the same calls as AsyncSandbox (which it runs)."""

    def __init__(self, fleet: Fleet, lease: Lease) -> None:
        self.fleet = fleet
        self._async = AsyncSandbox(fleet._async, lease)

    @property
    def lease(self) -> Lease:
        return self._async.lease

    @lease.setter
    def lease(self, lease: Lease) -> None:
        self._async.lease = lease

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.fleet._run(coroutine)

    exec = _blocking(AsyncSandbox.exec)
    read_file = _blocking(AsyncSandbox.read_file)
    write_file = _blocking(AsyncSandbox.write_file)
    list_files = _blocking(AsyncSandbox.list_files)
    evaluate = _blocking(AsyncSandbox.evaluate)
    score = _blocking(AsyncSandbox.score)
    upload_archive = _blocking(AsyncSandbox.upload_archive)
    download_archive = _blocking(AsyncSandbox.download_archive)
    renew = _blocking(AsyncSandbox.renew)
    release = _blocking(AsyncSandbox.release)
