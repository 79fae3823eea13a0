"""The wait queue of each shelf (pool, image): waiters paired with warm sandboxes and claimed for."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from sandfleet.core.leases import LeaseRecord
from sandfleet.core.model import SandboxPod
from sandfleet.core.queueing import RateEstimator, admit, boot_overlap, eta_per_place, serve_plan
from sandfleet.core.warm_index import Shelf
from sandfleet.gateway.backend import Backend
from sandfleet.gateway.lease_errors import PoolQueueFull, SandboxWithdrawn, WaitTimeout
from sandfleet.gateway.lease_requests import Granted, LeaseRequest

MAX_READY_TIMES = 100_000  # sandboxes whose first warm moment is remembered (for boot time)
MAX_STALE = 100_000  # lost claims remembered (a deleted Pod's entry would otherwise stay forever)


@dataclass(eq=False)
class _Waiter:
    request: LeaseRequest
    shelf: Shelf
    ttl: int
    arrived: float
    future: asyncio.Future[list[tuple[LeaseRecord, SandboxPod]]]
    got: list[tuple[LeaseRecord, SandboxPod]] = field(default_factory=list)
    claim_seconds: float = 0.0
    abandoned: bool = False  # its wait ran out
    cancelled: bool = False  # its caller went away: whatever it gets goes back to warm
    in_flight: list[SandboxPod] = field(default_factory=list)  # claims being written for it now

    @property
    def missing(self) -> int:
        return self.request.count - len(self.got)

    @property
    def enough(self) -> bool:
        """Whether what it holds may be handed over (a batch at its minimum; a group only whole)."""
        return len(self.got) >= self.request.least


def _requeue(waiters: deque[_Waiter], waiter: _Waiter) -> None:
    """Put a waiter back where its arrival places it (it left the queue while its claims ran)."""
    for index, other in enumerate(waiters):
        if other.arrived > waiter.arrived:
            waiters.insert(index, waiter)
            return
    waiters.append(waiter)


@dataclass
class _PoolQueue:
    waiters: deque[_Waiter] = field(default_factory=deque)
    claiming: set[str] = field(default_factory=set)
    refills: RateEstimator = field(default_factory=RateEstimator)
    wake: asyncio.TimerHandle | None = None  # a dispatch when the head may stop being overtaken


class LeaseQueues:
    """A FIFO queue per shelf; core.queueing.serve_plan decides who is served from what is warm.

    An acquire is a whole request (one sandbox, or an all-or-nothing group) or a batch (up to
    `count`, at least `min_count`, within its wait). A caller who goes away leaves no lease behind.
    """

    def __init__(
        self,
        backend: Backend,
        clock: Callable[[], float],
        on_claimed: Callable[[SandboxPod], None],
        max_waiting: int = 1000,
        spinup_seconds: float = 2.0,
        overtake_seconds: float = 5.0,
    ) -> None:
        self.backend = backend
        self.clock = clock
        self.on_claimed = on_claimed  # told of every sandbox claimed for a waiter
        self.max_waiting = max_waiting
        self.spinup_seconds = spinup_seconds
        self.overtake_seconds = overtake_seconds  # see core.queueing.serve_order
        self._queues: dict[Shelf, _PoolQueue] = {}
        # sandbox key -> resourceVersion a claim lost on: that version is not warm, whatever the
        # index says until the watch brings the newer one.
        self._stale: OrderedDict[str, str] = OrderedDict()
        # Sandboxes claimed for callers who went away, until their un-claim lands: never handed to
        # a retry with the same idempotency key in between.
        self.disowned: set[str] = set()
        # Claims and give-backs running on their own, held so the loop cannot drop them.
        self.background: set[asyncio.Task[None]] = set()
        self._ready_at: OrderedDict[str, float] = OrderedDict()  # sandbox key -> first seen warm

    def waiting(self, pool: str) -> int:
        return sum(len(q.waiters) for (name, _), q in self._queues.items() if name == pool)

    def on_change(self, sandbox: SandboxPod) -> None:
        """A sandbox changed: forget a version a claim lost on, and serve the queue it is warm for."""
        if self._stale.get(sandbox.key, sandbox.version) != sandbox.version:
            del self._stale[sandbox.key]  # the version a claim lost on has been superseded
        if sandbox.warm:
            if sandbox.key not in self._ready_at:
                self._ready_at[sandbox.key] = self.clock()
                while len(self._ready_at) > MAX_READY_TIMES:
                    self._ready_at.popitem(last=False)
            shelf = (sandbox.pool, sandbox.image_key)
            queue = self._queues.get(shelf)
            if queue is not None:
                queue.refills.observe(self.clock())
                self._dispatch(shelf)

    async def wait_and_claim(self, request: LeaseRequest, shelf: Shelf, ttl: int) -> Granted:
        """Lease `request.count` sandboxes of `shelf` for `ttl` s, waiting in its queue if none is warm."""
        queue = self._queues.setdefault(shelf, _PoolQueue())
        now = self.clock()
        position = len(queue.waiters) + 1
        eta_each = eta_per_place(queue.refills.current(now), self.spinup_seconds)
        # Only a caller who would have to wait is subject to the queue's limit.
        if queue.waiters or len(self.backend.warm(*shelf)) < request.least:
            admission = admit(len(queue.waiters), self.max_waiting, eta_each / request.count)
            if not admission.admitted:
                raise PoolQueueFull(request.pool, admission)
        loop = asyncio.get_running_loop()
        waiter = _Waiter(request, shelf, ttl, now, loop.create_future())
        started = time.monotonic()
        waiter.got = await self._claim_reserved(waiter)
        if waiter.missing == 0:
            return Granted(waiter.got, 0.0, time.monotonic() - started, 0, 0.0)
        queue.waiters.append(waiter)
        self._dispatch(shelf)
        try:
            try:
                leases = await asyncio.wait_for(asyncio.shield(waiter.future), request.wait_seconds)
            except TimeoutError:
                leases = await self._give_up(queue, waiter, eta_each)
        except asyncio.CancelledError:
            self._cancel(queue, waiter)
            raise
        waited = max(time.monotonic() - started - waiter.claim_seconds, 0.0)
        boot = self._boot_seconds(waiter, leases, waited)
        return Granted(leases, waited - boot, waiter.claim_seconds, position - 1, boot)

    async def _claim_reserved(self, waiter: _Waiter) -> list[tuple[LeaseRecord, SandboxPod]]:
        """Claim the sandboxes its run's earlier episodes left reset (a recycling pool's), first.

        They are the run's alone, so no other caller's place in the queue is passed over.
        """
        request = waiter.request
        run = request.labels.get("run")
        if not run:
            return []
        kept = self.backend.take_reserved(*waiter.shelf, request.holder, run, request.count)
        if not kept:
            return []
        now = self.clock()
        attempts = [self._lease_for(waiter, sandbox, now) for sandbox in kept]
        claims = asyncio.gather(
            *(self.backend.claim(s, lease) for s, lease in zip(kept, attempts, strict=True)),
            return_exceptions=True,
        )

        def claimed(results: Sequence[object]) -> list[tuple[LeaseRecord, SandboxPod]]:
            pairs = zip(attempts, results, strict=True)
            return [(lease, result) for lease, result in pairs if isinstance(result, SandboxPod)]

        try:
            got = claimed(await asyncio.shield(claims))
        except asyncio.CancelledError:
            # Its caller went away mid-claim: what lands goes back to the run, as nobody got it.
            claims.add_done_callback(lambda done: self._give_back(claimed(done.result())))
            raise
        for _, sandbox in got:
            self.on_claimed(sandbox)
        return got

    def _boot_seconds(
        self, waiter: _Waiter, leases: list[tuple[LeaseRecord, SandboxPod]], waited: float
    ) -> float:
        """The part of a wait spent on sandboxes being created (a group waits for its slowest)."""
        granted = waiter.arrived + waited
        boot = 0.0
        for _, sandbox in leases:
            ready = self._ready_at.pop(sandbox.key, None)
            boot = max(boot, boot_overlap(waiter.arrived, granted, sandbox.created_at, ready))
        return min(boot, waited)

    async def _give_up(
        self, queue: _PoolQueue, waiter: _Waiter, eta_each: float
    ) -> list[tuple[LeaseRecord, SandboxPod]]:
        waiter.abandoned = True
        if waiter in queue.waiters:
            position = list(queue.waiters).index(waiter) + 1
            queue.waiters.remove(waiter)
            self._dispatch(waiter.shelf)  # a group that left the head may unblock those behind
            if waiter.enough:
                return waiter.got  # a batch at its deadline: what it got, at least its minimum
            # All or nothing: what a group (or a batch below its minimum) got goes back to warm.
            await asyncio.shield(self._give_back(waiter.got))
            raise WaitTimeout(waiter.request.pool, position, position * eta_each)
        # Its claims are in flight: they finish in a round trip, and the caller gets them.
        return await waiter.future

    def _dispatch(self, shelf: Shelf) -> None:
        """Pair waiters, head first, with warm sandboxes and claim them concurrently.

        The backend's ordered index hands out only what is taken: the cost is O(k log n) for k
        sandboxes, not a scan and sort of the whole pool on every acquire and every change.
        """
        queue = self._queues.get(shelf)
        if not queue or not queue.waiters:
            return
        warm = self.backend.warm(*shelf)

        def skip(sandbox: SandboxPod) -> bool:
            # Taken sandboxes leave the index, so these are only the few an event brought back
            # while their claim is still in flight, or whose version a claim just lost on.
            return sandbox.key in queue.claiming or self._stale.get(sandbox.key) == sandbox.version

        now = self.clock()
        seen: list[_Waiter] = []

        def needs() -> Iterator[tuple[int, float, bool]]:
            for waiter in queue.waiters:
                seen.append(waiter)
                yield waiter.missing, now - waiter.arrived, waiter.request.batch

        # Who is served now, who may overtake a group that cannot be, and what a batch takes:
        # core.queueing's rule.
        for index, take in serve_plan(needs(), len(warm), self.overtake_seconds):
            waiter = seen[index]
            chosen = warm.take(take, waiter.request.regions, skip)
            if len(chosen) < take and not (waiter.request.batch and chosen):
                for sandbox in chosen:
                    warm.put(sandbox)
                break  # some are mid-claim or stale: the next change dispatches again
            queue.waiters.remove(waiter)
            for sandbox in chosen:
                queue.claiming.add(sandbox.key)
            waiter.in_flight = chosen
            task = asyncio.ensure_future(self._claim_for(queue, waiter, chosen))
            self.background.add(task)
            task.add_done_callback(self.background.discard)
        if queue.waiters:
            self.backend.demand(*shelf, sum(waiter.missing for waiter in queue.waiters))
        self._wake_when_due(shelf, queue, now)

    def _wake_when_due(self, shelf: Shelf, queue: _PoolQueue, now: float) -> None:
        """Dispatch again when the oldest waiter reaches the overtaking bound.

        No sandbox may change at that moment, yet from then on it collects what is warm: without
        this wake-up a group passed over while young would wait for the next change, maybe forever.
        """
        if not queue.waiters or queue.wake is not None:
            return
        due = self.overtake_seconds - (now - queue.waiters[0].arrived)
        if due >= 0:
            queue.wake = asyncio.get_running_loop().call_later(due + 0.01, self._wake, shelf)

    def _wake(self, shelf: Shelf) -> None:
        queue = self._queues.get(shelf)
        if queue is not None:
            queue.wake = None
            self._dispatch(shelf)

    async def _claim_for(self, queue: _PoolQueue, waiter: _Waiter, chosen: list[SandboxPod]) -> None:
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
        waiter.in_flight = []
        failure: BaseException | None = None
        for sandbox, lease, result in zip(chosen, attempts, results, strict=True):
            if isinstance(result, SandboxPod):
                waiter.got.append((lease, result))
                self.on_claimed(result)
                continue
            self.disowned.discard(sandbox.key)
            if result is None:
                # Somebody changed it first (409) or it is gone (404): skip this version of it.
                self._stale[sandbox.key] = sandbox.version
                while len(self._stale) > MAX_STALE:
                    self._stale.popitem(last=False)
            elif isinstance(result, SandboxWithdrawn):
                pass  # off the shelves with its cluster: the waiter takes another below
            else:
                # The write itself failed (the apiserver is away): the sandbox is as free as it was,
                # so it goes back in the index rather than being shunned, and the caller is told
                # now (a 503 to retry), not after its whole wait.
                failure = failure or result
                current = self.backend.sandbox(sandbox.key)
                if current is not None and current.warm:
                    self.backend.warm(*waiter.shelf).put(current)
        if waiter.cancelled:
            # Its caller has gone: nobody will ever hear of these leases, so they go back to warm.
            self._give_back(waiter.got)
            waiter.got = []
        elif waiter.future.done():
            return
        elif waiter.missing == 0 or (waiter.abandoned and failure is None and waiter.enough):
            waiter.future.set_result(waiter.got)  # whole, or a batch whose wait ended meanwhile
        elif waiter.abandoned or failure is not None:
            await asyncio.shield(self._give_back(waiter.got))
            waiter.future.set_exception(
                failure or WaitTimeout(waiter.request.pool, 1, eta_per_place(0, self.spinup_seconds))
            )
        elif waiter.request.batch:
            _requeue(queue.waiters, waiter)  # a batch collecting: back in its place by arrival
        else:
            queue.waiters.appendleft(waiter)  # lost a race: keep its place at the head
        self._dispatch(waiter.shelf)

    def _lease_for(self, waiter: _Waiter, sandbox: SandboxPod, now: float) -> LeaseRecord:
        request = waiter.request
        return LeaseRecord(
            id=sandbox.next_lease_id,
            pool=request.pool,
            holder=request.holder,
            acquired_at=now,
            expires_at=now + waiter.ttl,
            ttl_seconds=waiter.ttl,
            labels=dict(request.labels),
            idempotency_key=request.idempotency_key,
            policy_version=request.policy_version,
            attempt=request.attempt,
            request=request.asked,
        )

    def _cancel(self, queue: _PoolQueue, waiter: _Waiter) -> None:
        """The caller went away (disconnected, or its task was cancelled): leave no lease behind."""
        waiter.abandoned = waiter.cancelled = True
        if waiter in queue.waiters:
            queue.waiters.remove(waiter)
            self._give_back(waiter.got)  # a group's partial claims
            waiter.got = []
            self._dispatch(waiter.shelf)  # a group that left the head may unblock those behind
        elif waiter.in_flight:
            # _claim_for gives them back when they land; until then a retry must not adopt them.
            self.disowned.update(s.key for s in waiter.in_flight)
            self.disowned.update(s.key for _, s in waiter.got)
        elif waiter.future.done() and not waiter.future.cancelled() and not waiter.future.exception():
            self._give_back(waiter.future.result())  # granted in the very step it was cancelled

    def _give_back(self, leases: list[tuple[LeaseRecord, SandboxPod]]) -> asyncio.Future[None]:
        """Un-claim sandboxes nobody received, in a task of its own (a cancelled caller can't wait)."""
        keys = {sandbox.key for _, sandbox in leases}
        self.disowned.update(keys)

        async def give_back() -> None:
            try:
                await asyncio.gather(*(self._unclaim(sandbox) for _, sandbox in leases))
            finally:
                self.disowned.difference_update(keys)

        task = asyncio.ensure_future(give_back())
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task

    async def _unclaim(self, sandbox: SandboxPod) -> None:
        with contextlib.suppress(Exception):
            await self.backend.unclaim(sandbox)
