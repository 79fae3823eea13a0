"""A steady lease/exec/release load from the real client (sandfleet.client), with every call recorded.

Workers lease, exec, write and read a file, and release, over and over, spreading over the gateway
replicas and failing over to the next one when a replica stops answering (as a Service would).
Holders lease and keep using their sandbox until told to stop, so a fault can hit a held lease.
Everything a client did and was told becomes `ClientLease` records for tests/support/invariants.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from sandfleet.client import AsyncFleet, AsyncSandbox, Lease, SandfleetError
from sandfleet.core.model import lease_episode
from tests.support.invariants import Call, ClientLease

T = TypeVar("T")
REQUEST_TIMEOUT = 20.0  # a call that takes longer is a hang, and recorded as such


@dataclass
class LoadStats:
    """What the load saw besides lease records: acquire attempts and data-plane anomalies."""

    acquires: list[Call] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)
    episodes: int = 0


class Load:
    """Workers and holders on an event loop of their own, in a background thread."""

    def __init__(
        self,
        urls: Sequence[str],
        token: str,
        pool: str,
        workers: int = 3,
        ttl_seconds: int = 10,
        think_seconds: float = 0.1,
    ) -> None:
        self.urls = list(urls)
        self.token = token
        self.pool = pool
        self.workers = workers
        self.ttl_seconds = ttl_seconds
        self.think_seconds = think_seconds
        self.leases: list[ClientLease] = []
        self.stats = LoadStats()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="load", daemon=True)
        self._stopping: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._fleets: list[AsyncFleet] = []

    # -- control (from the test's thread) --------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        self._run(self._start())

    def stop(self, timeout: float = 60) -> None:
        """Let every worker and holder finish its episode (released) and stop."""
        self._run(self._stop(), timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def hold(
        self, count: int, regions: Sequence[str] = (), ttl_seconds: int | None = None
    ) -> list[ClientLease]:
        """Start `count` holders; returns their leases once granted. They exec until `release_holders`."""
        return self._run(self._hold(count, tuple(regions), ttl_seconds or self.ttl_seconds), 60)

    def release_holders(self, timeout: float = 60) -> None:
        self._run(self._release_holders(), timeout)

    def pause_workers(self, timeout: float = 60) -> None:
        """Workers finish the episode they are in and take no new lease until `resume_workers`.

        A check that the pool is back at its warm target races the workers' consumption (each
        lease takes a warm sandbox that a replacement has yet to refill), so it runs paused.
        """
        self._run(self._pause_workers(), timeout)

    def resume_workers(self) -> None:
        self._loop.call_soon_threadsafe(self._unpaused.set)

    def _run(self, coroutine: Awaitable[T], timeout: float = 30) -> T:
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(
            coroutine,  # type: ignore[arg-type]
            self._loop,
        )
        return future.result(timeout)

    # -- on the loop -----------------------------------------------------------------------------

    async def _start(self) -> None:
        self._stopping = asyncio.Event()
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._idle_workers = 0
        self._all_idle = asyncio.Event()
        self._holders_done = asyncio.Event()
        self._holder_tasks: list[asyncio.Task[None]] = []
        # retries=1: a replica that stopped answering is left quickly for the next one.
        self._fleets = [
            AsyncFleet(url, token=self.token, timeout=REQUEST_TIMEOUT, retries=1) for url in self.urls
        ]
        for index in range(self.workers):
            self._tasks.append(asyncio.ensure_future(self._worker(index)))

    async def _stop(self) -> None:
        assert self._stopping is not None
        self._stopping.set()
        self._unpaused.set()
        self._holders_done.set()
        await asyncio.gather(*self._tasks, *self._holder_tasks, return_exceptions=True)
        for fleet in self._fleets:
            await fleet.__aexit__()

    async def _worker(self, index: int) -> None:
        assert self._stopping is not None
        replica = index % len(self._fleets)
        while not self._stopping.is_set():
            if not self._unpaused.is_set():
                self._idle_workers += 1
                if self._idle_workers == self.workers:
                    self._all_idle.set()
                await self._unpaused.wait()
                self._idle_workers -= 1
                self._all_idle.clear()
                continue
            lease, replica = await self._acquire(replica, (), self.ttl_seconds)
            if lease is None:
                await asyncio.sleep(0.3)
                continue
            record, client_lease = lease
            replica = await self._episode(record, client_lease, replica, rounds=2)
            replica = await self._release(record, client_lease, replica)
            self.stats.episodes += 1
            await asyncio.sleep(self.think_seconds)

    async def _hold(self, count: int, regions: tuple[str, ...], ttl: int) -> list[ClientLease]:
        granted: list[ClientLease] = []
        ready = asyncio.Event()

        async def holder(index: int) -> None:
            replica = index % len(self._fleets)
            lease = None
            deadline = time.monotonic() + 45
            while lease is None and time.monotonic() < deadline:
                lease, replica = await self._acquire(replica, regions, ttl)
            if lease is None:
                ready.set()
                return
            record, client_lease = lease
            granted.append(record)
            if len(granted) == count:
                ready.set()
            while not self._holders_done.is_set():
                replica, alive = await self._call_round(record, client_lease, replica)
                if alive and time.time() > record.expires_at - ttl / 2:
                    replica, alive = await self._renew(record, client_lease, replica, ttl)
                if not alive:
                    break
                await asyncio.sleep(0.3)
            await self._release(record, client_lease, replica)

        self._holders_done.clear()
        self._holder_tasks = [asyncio.ensure_future(holder(i)) for i in range(count)]
        await asyncio.wait_for(ready.wait(), 50)
        return list(granted)

    async def _pause_workers(self) -> None:
        self._unpaused.clear()
        await self._all_idle.wait()

    async def _release_holders(self) -> None:
        self._holders_done.set()
        await asyncio.gather(*self._holder_tasks, return_exceptions=True)

    # -- one lease's calls -----------------------------------------------------------------------

    async def _acquire(
        self, replica: int, regions: tuple[str, ...], ttl: int
    ) -> tuple[tuple[ClientLease, Lease] | None, int]:
        """One acquire, failing over between replicas with the same idempotency key."""
        key = uuid.uuid4().hex
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            fleet = self._fleets[replica]
            started = time.time()
            try:
                (lease,) = await fleet.acquire(
                    self.pool, regions=regions, ttl_seconds=ttl, wait_seconds=10,
                    idempotency_key=key, labels={"run": "faults"},
                )  # fmt: skip
            except SandfleetError as error:
                self.stats.acquires.append(_failed("acquire", started, error))
                if error.status in (503, 429, 504):
                    replica = (replica + 1) % len(self._fleets)
                    await asyncio.sleep(min(float(error.body.get("retry_after_seconds", 1)), 1.0))
                    continue
                return None, replica
            except httpx.HTTPError as error:
                self.stats.acquires.append(_broken("acquire", started, error))
                replica = (replica + 1) % len(self._fleets)
                await asyncio.sleep(0.2)
                continue
            self.stats.acquires.append(Call("acquire", started, time.time(), ok=True))
            record = ClientLease(
                key, lease.sandbox, time.time(), lease.expires_at, episode=lease_episode(lease.id) or 0
            )
            self.leases.append(record)
            return (record, lease), replica
        return None, replica

    async def _episode(self, record: ClientLease, lease: Lease, replica: int, rounds: int) -> int:
        for _ in range(rounds):
            replica, alive = await self._call_round(record, lease, replica)
            if not alive:
                break
            await asyncio.sleep(self.think_seconds)
        return replica

    async def _call_round(self, record: ClientLease, lease: Lease, replica: int) -> tuple[int, bool]:
        """Exec, write and read once; (the replica to use next, whether the lease still stands)."""
        steps: list[tuple[str, Callable[[AsyncSandbox], Awaitable[Any]]]] = [
            ("exec", lambda s: self._claim_workspace(s, record)),
            ("write", lambda s: s.write_file("work.txt", record.key)),
            ("read", lambda s: self._read_back(s, record)),
        ]
        for kind, step in steps:
            sandbox = AsyncSandbox(self._fleets[replica], lease)
            call, _ = await self._timed(kind, step(sandbox))
            record.calls.append(call)
            if call.lease_error:
                return replica, False
            if not call.ok:
                # The round's steps build on each other (no read-back of a write that failed):
                # the next round starts over, on the next replica if this one is away.
                if call.status in (None, 503):
                    replica = (replica + 1) % len(self._fleets)
                return replica, True
        return replica, True

    async def _renew(self, record: ClientLease, lease: Lease, replica: int, ttl: int) -> tuple[int, bool]:
        """Heartbeat a held lease, as a long episode must; (the replica to use next, still held)."""
        call, renewed = await self._timed("renew", self._fleets[replica].renew(lease.id, ttl))
        record.calls.append(call)
        if isinstance(renewed, Lease):
            record.expires_at = renewed.expires_at
        elif not call.ok and call.status in (None, 503):
            replica = (replica + 1) % len(self._fleets)
        return replica, not call.lease_error

    async def _claim_workspace(self, sandbox: AsyncSandbox, record: ClientLease) -> None:
        # The workspace must be this episode's alone: another holder's mark means a double lease.
        script = 'test -e owner && test "$(cat owner)" != "$KEY" && cat owner && exit 3; echo "$KEY" > owner'
        result = await sandbox.exec(["sh", "-c", script], env={"KEY": record.key})
        if result.exit_code == 3:
            self.stats.anomalies.append(
                f"pod {record.pod}: lease {record.key} found the workspace of {result.stdout.strip()}"
            )

    async def _read_back(self, sandbox: AsyncSandbox, record: ClientLease) -> None:
        data = await sandbox.read_file("work.txt")
        if data.decode() != record.key:
            self.stats.anomalies.append(f"pod {record.pod}: lease {record.key} read back {data!r}")

    async def _release(self, record: ClientLease, lease: Lease, replica: int) -> int:
        """Release, retried on other replicas until answered (idempotent), or until the TTL is over."""
        while True:
            started = time.time()
            try:
                released = await self._fleets[replica].release(lease.id)
            except SandfleetError as error:
                record.calls.append(_failed("release", started, error))
                if error.status not in (503, None):
                    return replica
            except httpx.HTTPError as error:
                record.calls.append(_broken("release", started, error))
            else:
                record.calls.append(Call("release", started, time.time(), ok=True, released=released))
                return replica
            if time.time() > record.expires_at + 5:
                return replica  # the TTL ended it: the operator reaps it without us
            replica = (replica + 1) % len(self._fleets)
            await asyncio.sleep(0.5)

    async def _timed(self, kind: str, work: Awaitable[Any]) -> tuple[Call, Any]:
        started = time.time()
        try:
            value = await work
        except SandfleetError as error:
            return _failed(kind, started, error), None
        except httpx.HTTPError as error:
            return _broken(kind, started, error), None
        return Call(kind, started, time.time(), ok=True), value


def _failed(kind: str, started: float, error: SandfleetError) -> Call:
    return Call(
        kind, started, time.time(), ok=False, status=error.status, code=error.code, detail=error.detail
    )


def _broken(kind: str, started: float, error: httpx.HTTPError) -> Call:
    # No answer at all: a replica died mid-call, or the call hung past REQUEST_TIMEOUT.
    return Call(kind, started, time.time(), ok=False, code=type(error).__name__, detail=str(error))
