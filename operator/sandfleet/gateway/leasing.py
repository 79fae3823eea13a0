"""The lease service: claims warm sandboxes for callers in FIFO order per pool, renews and releases."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sandfleet.core import api
from sandfleet.core.leases import Lease, LeaseError, choose_ttl
from sandfleet.core.model import image_key
from sandfleet.core.queueing import Admission, RateEstimator, admit, eta_per_place
from sandfleet.core.sandboxes import Sandbox, pick_warm
from sandfleet.gateway.backend import Backend, PoolInfo


class NotFound(LookupError):
    """No such pool or lease."""


class Gone(LookupError):
    """The lease existed but has ended (released or expired): its sandbox is not coming back."""


class Forbidden(PermissionError):
    """The caller may not touch this lease."""


class QueueFull(RuntimeError):
    """Too many callers are already waiting for this pool."""

    def __init__(self, pool: str, admission: Admission) -> None:
        super().__init__(
            f"pool {pool!r} has {admission.position - 1} callers waiting already; "
            f"retry in {admission.retry_after_seconds}s"
        )
        self.admission = admission


class WaitTimeout(TimeoutError):
    """No sandbox became free within the caller's wait."""

    def __init__(self, pool: str, position: int, eta_seconds: float) -> None:
        super().__init__(
            f"no warm sandbox in pool {pool!r} within the wait; you were number {position} "
            f"in the queue, estimated {eta_seconds:.1f}s more"
        )
        self.position = position
        self.eta_seconds = eta_seconds


@dataclass(frozen=True)
class LeaseRequest:
    """What a caller asks for (already validated by the API layer)."""

    pool: str
    holder: str
    image: str | None = None  # a task image (pre-warmed by prefetch); the pool's own when None
    count: int = 1
    regions: tuple[str, ...] = ()
    ttl_seconds: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    idempotency_key: str | None = None
    policy_version: int | None = None
    wait_seconds: float = 30.0


@dataclass(frozen=True)
class Granted:
    """Leases handed out, with where the time went."""

    leases: list[tuple[Lease, Sandbox]]
    queue_seconds: float
    claim_seconds: float
    position: int  # place in the queue on arrival; 0 when served at once


Shelf = tuple[str, str]  # (pool, image key): sandboxes that are interchangeable for a lease


@dataclass(eq=False)
class _Waiter:
    request: LeaseRequest
    shelf: Shelf
    ttl: int
    arrived: float
    future: asyncio.Future[list[tuple[Lease, Sandbox]]]
    got: list[tuple[Lease, Sandbox]] = field(default_factory=list)
    claim_seconds: float = 0.0
    abandoned: bool = False

    @property
    def missing(self) -> int:
        return self.request.count - len(self.got)


@dataclass
class _PoolQueue:
    waiters: deque[_Waiter] = field(default_factory=deque)
    claiming: set[str] = field(default_factory=set)
    refills: RateEstimator = field(default_factory=RateEstimator)


class LeaseService:
    """Hands out leases over a Backend. One per gateway process; any number of gateways may run."""

    def __init__(
        self,
        backend: Backend,
        clock: Callable[[], float] = time.time,
        max_waiting: int = 1000,
        spinup_seconds: float = 2.0,
    ) -> None:
        self.backend = backend
        self.clock = clock
        self.max_waiting = max_waiting
        self.spinup_seconds = spinup_seconds
        self._queues: dict[Shelf, _PoolQueue] = {}
        self._stale: dict[str, str] = {}  # sandbox key -> resourceVersion a claim lost on
        self._by_idempotency_key: dict[str, asyncio.Future[Granted]] = {}
        self._claims: set[asyncio.Task[None]] = set()  # held so the loop cannot drop them
        backend.subscribe(self._on_change)

    # -- acquire -------------------------------------------------------------------------------

    def pool(self, name: str) -> PoolInfo:
        pool = self.backend.pool(name)
        if pool is None:
            raise NotFound(f"no pool named {name!r}: list pools with GET /v1/pools")
        return pool

    def pool_for_image(self, image: str) -> str:
        """The pool to lease `image` from: one whose template runs it, or that has it warm."""
        for pool in self.backend.pools():
            if pool.image == image:
                return pool.name
        key = image_key(image)
        for sandbox in self.backend.sandboxes():
            if sandbox.image_key == key:
                return sandbox.pool
        raise NotFound(f"no pool runs image {image!r}: prefetch it into a pool with POST /v1/prefetch")

    async def acquire(self, request: LeaseRequest) -> Granted:
        """Lease `count` sandboxes from the pool, waiting in its FIFO queue if none is warm."""
        pool = self.pool(request.pool)
        ttl = choose_ttl(request.ttl_seconds, pool.default_ttl_seconds, pool.max_ttl_seconds)
        shelf = (pool.name, image_key(request.image or pool.image))
        if request.idempotency_key:
            return await self._acquire_once(request, shelf, ttl)
        return await self._acquire(request, shelf, ttl)

    async def _acquire_once(self, request: LeaseRequest, shelf: Shelf, ttl: int) -> Granted:
        """A retried request with the same idempotency key gets the same leases, never new ones."""
        key = f"{request.holder}/{request.idempotency_key}"
        earlier = self._leases_with_key(request.idempotency_key or "", request.holder)
        if earlier:
            return Granted(earlier, 0.0, 0.0, 0)
        running = self._by_idempotency_key.get(key)
        if running is None:
            running = asyncio.ensure_future(self._acquire(request, shelf, ttl))
            self._by_idempotency_key[key] = running
            running.add_done_callback(lambda _: self._by_idempotency_key.pop(key, None))
        return await asyncio.shield(running)

    def _leases_with_key(self, idempotency_key: str, holder: str) -> list[tuple[Lease, Sandbox]]:
        found = []
        for sandbox in self.backend.sandboxes():
            lease = sandbox.lease
            if (
                lease is not None
                and sandbox.state == api.LEASE_LEASED
                and lease.idempotency_key == idempotency_key
                and lease.holder == holder
            ):
                found.append((lease, sandbox))
        return found

    async def _acquire(self, request: LeaseRequest, shelf: Shelf, ttl: int) -> Granted:
        queue = self._queues.setdefault(shelf, _PoolQueue())
        now = self.clock()
        position = len(queue.waiters) + 1
        eta_each = eta_per_place(queue.refills.current(now), self.spinup_seconds)
        # Only a caller who would have to wait is subject to the queue's limit.
        if queue.waiters or len(self._available(shelf, queue)) < request.count:
            admission = admit(len(queue.waiters), self.max_waiting, eta_each / request.count)
            if not admission.admitted:
                raise QueueFull(request.pool, admission)
        loop = asyncio.get_running_loop()
        waiter = _Waiter(request, shelf, ttl, now, loop.create_future())
        queue.waiters.append(waiter)
        self._dispatch(shelf)
        started = time.monotonic()
        try:
            leases = await asyncio.wait_for(asyncio.shield(waiter.future), request.wait_seconds)
        except TimeoutError:
            leases = await self._give_up(queue, waiter, eta_each)
        waited = time.monotonic() - started - waiter.claim_seconds
        return Granted(leases, max(waited, 0.0), waiter.claim_seconds, position - 1)

    async def _give_up(
        self, queue: _PoolQueue, waiter: _Waiter, eta_each: float
    ) -> list[tuple[Lease, Sandbox]]:
        waiter.abandoned = True
        if waiter in queue.waiters:
            position = list(queue.waiters).index(waiter) + 1
            queue.waiters.remove(waiter)
            # All or nothing: release what a group got so far (unused; the operator replaces them).
            await asyncio.gather(*(self._unclaim(s) for _, s in waiter.got))
            raise WaitTimeout(waiter.request.pool, position, position * eta_each)
        # Its claims are in flight: they finish in a round trip, and the caller gets them.
        return await waiter.future

    def _dispatch(self, shelf: Shelf) -> None:
        """Pair waiters, head first, with warm sandboxes and claim them concurrently."""
        queue = self._queues.get(shelf)
        if not queue or not queue.waiters:
            return
        available = self._available(shelf, queue)  # oldest first, across all regions
        while queue.waiters and available:
            waiter = queue.waiters[0]
            if waiter.missing > len(available):
                break  # strict FIFO: a group at the head is not overtaken by smaller requests
            queue.waiters.popleft()
            if waiter.request.regions:
                chosen = pick_warm(available, waiter.request.regions)[: waiter.missing]
                taken = {s.key for s in chosen}
                available = [s for s in available if s.key not in taken]
            else:
                chosen, available = available[: waiter.missing], available[waiter.missing :]
            for sandbox in chosen:
                queue.claiming.add(sandbox.key)
            task = asyncio.ensure_future(self._claim_for(queue, waiter, chosen))
            self._claims.add(task)
            task.add_done_callback(self._claims.discard)

    def _available(self, shelf: Shelf, queue: _PoolQueue) -> list[Sandbox]:
        """Warm sandboxes of the shelf nobody is claiming and no claim has just lost a race on."""
        pool, key = shelf
        skip = frozenset(queue.claiming) | {
            name for name, version in list(self._stale.items()) if self._is_stale(name, version)
        }
        return pick_warm((s for s in self.backend.sandboxes(pool) if s.image_key == key), (), skip)

    async def _claim_for(self, queue: _PoolQueue, waiter: _Waiter, chosen: list[Sandbox]) -> None:
        started = time.monotonic()
        now = self.clock()
        attempts = [self._lease_for(waiter, sandbox, now) for sandbox in chosen]
        try:
            results = await asyncio.gather(
                *(self.backend.claim(s, lease) for s, lease in zip(chosen, attempts, strict=True)),
                return_exceptions=True,
            )
        finally:
            for sandbox in chosen:
                queue.claiming.discard(sandbox.key)
        waiter.claim_seconds += time.monotonic() - started
        for sandbox, lease, result in zip(chosen, attempts, results, strict=True):
            if isinstance(result, Sandbox):
                waiter.got.append((lease, result))
            else:
                self._stale[sandbox.key] = sandbox.resource_version
        if waiter.future.done():
            return
        if waiter.missing == 0:
            waiter.future.set_result(waiter.got)
        elif waiter.abandoned:
            await asyncio.gather(*(self._unclaim(s) for _, s in waiter.got))
            waiter.future.set_exception(
                WaitTimeout(waiter.request.pool, 1, eta_per_place(0, self.spinup_seconds))
            )
        else:
            queue.waiters.appendleft(waiter)  # lost a race: keep its place at the head
        self._dispatch(waiter.shelf)

    def _lease_for(self, waiter: _Waiter, sandbox: Sandbox, now: float) -> Lease:
        request = waiter.request
        return Lease(
            id=sandbox.key,
            pool=request.pool,
            holder=request.holder,
            acquired_at=now,
            expires_at=now + waiter.ttl,
            ttl_seconds=waiter.ttl,
            labels=dict(request.labels),
            idempotency_key=request.idempotency_key,
            policy_version=request.policy_version,
        )

    async def _unclaim(self, sandbox: Sandbox) -> None:
        with contextlib.suppress(Exception):
            await self.backend.release(sandbox)

    def _is_stale(self, key: str, version: str) -> bool:
        current = self.backend.sandbox(key)
        if current is None or current.resource_version != version:
            self._stale.pop(key, None)
            return False
        return True

    def _on_change(self, sandbox: Sandbox) -> None:
        if sandbox.warm:
            shelf = (sandbox.pool, sandbox.image_key)
            queue = self._queues.get(shelf)
            if queue is not None:
                queue.refills.observe(self.clock())
                self._dispatch(shelf)

    def waiting(self, pool: str) -> int:
        return sum(len(q.waiters) for (name, _), q in self._queues.items() if name == pool)

    # -- the lease's life ----------------------------------------------------------------------

    async def current(self, lease_id: str, holder: str | None = None) -> tuple[Lease, Sandbox]:
        """The live lease and its sandbox, or NotFound / Gone / Forbidden saying why not."""
        sandbox = self.backend.sandbox(lease_id) or await self.backend.fresh(lease_id)
        if sandbox is None or sandbox.lease is None or sandbox.lease.id != lease_id:
            raise NotFound(f"no lease {lease_id!r}: it never existed or its sandbox is gone")
        lease = sandbox.lease
        if holder is not None and lease.holder != holder:
            raise Forbidden(f"lease {lease_id!r} belongs to another caller")
        if sandbox.state == api.LEASE_RELEASED or sandbox.terminating:
            raise Gone(f"lease {lease_id!r} was released; acquire a new one")
        if lease.expired(self.clock()):
            raise Gone(f"lease {lease_id!r} expired; acquire a new one and renew it sooner")
        return lease, sandbox

    async def renew(self, lease_id: str, holder: str, ttl_seconds: int | None) -> Lease:
        for _ in range(5):
            lease, sandbox = await self.current(lease_id, holder)
            pool = self.backend.pool(lease.pool)
            max_ttl = pool.max_ttl_seconds if pool else lease.ttl_seconds
            ttl = choose_ttl(ttl_seconds, lease.ttl_seconds, max_ttl)
            renewed = lease.renewed(self.clock(), ttl)
            if await self.backend.write_lease(sandbox, renewed) is not None:
                return renewed
            await self.backend.fresh(lease_id)  # somebody else wrote it: read and try again
        raise LeaseError(f"lease {lease_id!r} is being changed by someone else; retry")

    async def release(self, lease_id: str, holder: str) -> bool:
        """Release a lease; True if this call released it, False if it had already ended."""
        try:
            _, sandbox = await self.current(lease_id, holder)
        except (NotFound, Gone):
            return False
        await self.backend.release(sandbox)
        return True

    async def release_run(self, run: str, holder: str | None) -> list[str]:
        """Release every live lease labelled with `run` (of `holder`, unless None); their ids."""
        now = self.clock()
        mine = [
            s
            for s in self.backend.sandboxes()
            if s.lease is not None
            and s.state == api.LEASE_LEASED
            and s.lease.run == run
            and (holder is None or s.lease.holder == holder)
            and not s.lease.expired(now)
        ]
        await asyncio.gather(*(self.backend.release(s) for s in mine))
        return [s.key for s in mine]

    def leases(
        self, pool: str | None = None, run: str | None = None, holder: str | None = None
    ) -> list[tuple[Lease, Sandbox]]:
        now = self.clock()
        found = []
        for sandbox in self.backend.sandboxes(pool):
            lease = sandbox.lease
            if lease is None or sandbox.state != api.LEASE_LEASED or lease.expired(now):
                continue
            if (run is None or lease.run == run) and (holder is None or lease.holder == holder):
                found.append((lease, sandbox))
        return sorted(found, key=lambda pair: pair[0].acquired_at)
