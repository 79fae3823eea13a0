"""The lease service: claims warm sandboxes for callers in FIFO order per pool, renews and releases.

An acquire is a whole request (one sandbox, or an all-or-nothing group) or a batch (up to `count`,
at least `min_count`, within its wait); core.queueing.serve_plan decides who is served from what.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from tenacity import AsyncRetrying, RetryError, TryAgain, retry_never, stop_after_attempt

from sandfleet.core import api
from sandfleet.core.lease_keys import (
    KeyOwner,
    adoptable,
    asked_otherwise,
    key_owner,
    request_fingerprint,
    still_to_claim,
)
from sandfleet.core.leases import LeaseError, LeaseRecord, choose_ttl
from sandfleet.core.model import SandboxPod, image_key, lease_episode
from sandfleet.core.queueing import Admission, RateEstimator, admit, eta_per_place, serve_plan
from sandfleet.core.quotas import (
    CapacityError,
    Quotas,
    check_batch,
    check_group,
    check_leases,
    check_prefetch,
)
from sandfleet.core.warm_index import Shelf
from sandfleet.gateway.backend import Backend, PoolInfo


class UnknownName(LookupError):
    """No pool, lease or run by that name, or no pool for an image (the client sees `NotFound`)."""


class LeaseGone(LookupError):
    """The lease existed but has ended (released or expired): its sandbox is not coming back.

    The client sees `LeaseEnded`; `sandfleet.kube.errors.Gone` is the apiserver's 410.
    """

    # Who held it, where the backend raising it knows better than the caller's view (a lease lost
    # with its fleet member): only that holder is told why, so a stranger learns nothing of the member.
    holder: str | None = None


class SandboxWithdrawn(RuntimeError):
    """A claim the backend gave up on, nobody getting the sandbox: its cluster is away.

    The backend (gateway.fleet) took that cluster's warm sandboxes off the shelves, so the waiter
    takes another instead of failing. It never reaches a caller.
    """


class NotTheHolder(PermissionError):
    """The caller may not touch this lease: another caller holds it (the client sees `Forbidden`)."""


class KeyReused(ValueError):
    """The idempotency key is in use for a different request (422)."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"idempotency key {key!r} is in use for a different request (its pool, image, count, "
            "min_count, ttl_seconds, labels, regions or policy_version differ): to retry that request, "
            "send exactly its body again; for a new request, use a new key (a key is free again once "
            "its leases have ended)"
        )


class PoolQueueFull(RuntimeError):
    """Too many callers are already waiting for this pool (the client sees `QueueFull`)."""

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
    min_count: int | None = None  # below `count`: a batch (up to count); None or count: a group
    attempt: str | None = None  # set per keyed attempt: the leases it claims carry it
    # The caller made the key for this request and never sent it before (the client's first try of
    # a key it generated): no earlier attempt can have claimed anything under it, so nothing needs
    # reading back. A caller that says so wrongly only gets fresh leases for its own retry.
    fresh_key: bool = False
    asked: str | None = None  # set on a keyed request: its request_fingerprint, on every lease it claims

    @property
    def least(self) -> int:
        """The fewest sandboxes this request accepts: `count` for a group, `min_count` for a batch."""
        return self.count if self.min_count is None else min(self.min_count, self.count)

    @property
    def batch(self) -> bool:
        return self.least < self.count


MAX_READY_TIMES = 100_000  # sandboxes whose first warm moment is remembered (for boot time)
MAX_STALE = 100_000  # lost claims remembered (a deleted Pod's entry would otherwise stay forever)
RENEW_ATTEMPTS = 5  # writes of a renewal, each lost to another writer, before the caller is told to retry


@dataclass(frozen=True)
class Granted:
    """Leases handed out, with where the time went."""

    leases: list[tuple[LeaseRecord, SandboxPod]]
    queue_seconds: float  # waiting, less the boot time below
    claim_seconds: float
    position: int  # place in the queue on arrival; 0 when served at once
    boot_seconds: float = 0.0  # of the wait, the time the sandbox it got was still booting (cold)


def boot_overlap(arrived: float, granted: float, created: float, ready: float | None) -> float:
    """The part of a wait over [arrived, granted] spent on a sandbox booting over [created, ready].

    Zero for a sandbox already warm on arrival, or whose creation or ready time is unknown.
    """
    if ready is None or created <= 0:
        return 0.0
    return max(0.0, min(granted, ready) - max(arrived, created))


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


@dataclass(eq=False)
class _Shared:
    """One acquire shared by the retries of a request (same idempotency key) that await it."""

    task: asyncio.Future[Granted]
    asked: str  # the request's fingerprint: another request with the key must not join it
    callers: int = 0


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


class LeaseService:
    """Hands out leases over a Backend. One per gateway process; any number of gateways may run."""

    def __init__(
        self,
        backend: Backend,
        clock: Callable[[], float] = time.time,
        max_waiting: int = 1000,
        spinup_seconds: float = 2.0,
        quotas: Quotas | None = None,
        overtake_seconds: float = 5.0,
    ) -> None:
        self.backend = backend
        self.clock = clock
        self.max_waiting = max_waiting
        self.spinup_seconds = spinup_seconds
        self.quotas = quotas or Quotas()
        self.overtake_seconds = overtake_seconds  # see core.queueing.serve_order
        self._queues: dict[Shelf, _PoolQueue] = {}
        # sandbox key -> resourceVersion a claim lost on: that version is not warm, whatever the
        # index says until the watch brings the newer one.
        self._stale: OrderedDict[str, str] = OrderedDict()
        self._by_idempotency_key: dict[KeyOwner, _Shared] = {}  # per tenant: see key_owner
        # Sandboxes claimed for callers who went away, until their un-claim lands: never handed to
        # a retry with the same idempotency key in between.
        self._disowned: set[str] = set()
        self._claims: set[asyncio.Task[None]] = set()  # held so the loop cannot drop them
        self._ready_at: OrderedDict[str, float] = OrderedDict()  # sandbox key -> first seen warm
        # Per tenant, the sandboxes seen leased to it (a superset: deletions are not announced, so
        # entries are checked against the backend before a quota is refused) and those it waits for.
        self._held: dict[str, set[str]] = {}
        self._holder_of: dict[str, str] = {}
        self._pending: dict[str, int] = {}
        backend.subscribe(self._on_change)

    # -- acquire -------------------------------------------------------------------------------

    def pool(self, name: str) -> PoolInfo:
        pool = self.backend.pool(name)
        if pool is None:
            raise UnknownName(f"no pool named {name!r}: list pools with GET /v1/pools")
        return pool

    def pool_for_image(self, image: str) -> str:
        """The pool to lease `image` from: one whose template runs it, or that has it warm."""
        for pool in self.backend.pools():
            if pool.image == image or image in pool.served_images:
                return pool.name
        key = image_key(image)
        for sandbox in self.backend.sandboxes():
            if sandbox.image_key == key:
                return sandbox.pool
        raise UnknownName(f"no pool runs image {image!r}: prefetch it into a pool with POST /v1/prefetch")

    async def acquire(self, request: LeaseRequest) -> Granted:
        """Lease `count` sandboxes from the pool, waiting in its FIFO queue if none is warm."""
        pool = self.pool(request.pool)
        if request.batch:
            check_batch(request.count, request.least, pool.name, pool.max_sandboxes, self.quotas)
        else:
            check_group(request.count, pool.name, pool.max_sandboxes, self.quotas)
        if request.image and not pool.other_images and not pool.serves(request.image):
            runs = ", ".join(repr(image) for image in (pool.image, *pool.served_images))
            raise CapacityError(
                "image_not_served",
                f"pool {pool.name!r} runs only {runs}, never {request.image!r}: "
                "leave out `image`, or lease from a pool whose template runs it",
            )
        ttl = choose_ttl(request.ttl_seconds, pool.default_ttl_seconds, pool.max_ttl_seconds)
        shelf = (pool.name, image_key(request.image or pool.image))
        if request.idempotency_key:
            return await self._acquire_once(request, shelf, ttl)
        return await self._acquire(request, shelf, ttl)

    async def _acquire_once(self, request: LeaseRequest, shelf: Shelf, ttl: int) -> Granted:
        """A retried request with the same idempotency key gets the same leases, never new ones."""
        key = key_owner(request.holder, request.idempotency_key or "")
        asked = request_fingerprint(
            pool=request.pool,
            image=request.image,
            count=request.count,
            least=request.least,
            ttl_seconds=request.ttl_seconds,
            labels=request.labels,
            regions=request.regions,
            policy_version=request.policy_version,
        )
        shared = self._by_idempotency_key.get(key)
        if (shared is None or shared.task.cancelled()) and not request.fresh_key:
            # What an earlier attempt (at any replica) claimed or was answered with, as the truth
            # has it now: a watch that lags would show part of an answer and give a different one.
            await self.backend.refresh_keyed(*key, request.pool)
            shared = self._by_idempotency_key.get(key)  # one may have started during the read
        if shared is None or shared.task.cancelled():  # called off, not yet forgotten: start afresh
            request = replace(request, attempt=uuid.uuid4().hex, asked=asked)
            found = self._leases_with_key(request.idempotency_key or "", request.holder)
            if asked_otherwise([lease for lease, _ in found], asked):
                raise KeyReused(request.idempotency_key or "")
            chosen = adoptable([lease for lease, _ in found], request.count, request.least)
            taken = {lease.id for lease in chosen}
            earlier = await self._adopt([f for f in found if f[0].id in taken], request.attempt)
            if earlier and not still_to_claim(request.count, request.least, len(earlier))[0]:
                return Granted(earlier, 0.0, 0.0, 0)  # a group's or a batch's: the same leases
            shared = _Shared(asyncio.ensure_future(self._acquire_rest(request, shelf, ttl, earlier)), asked)
            self._by_idempotency_key[key] = shared
            shared.task.add_done_callback(functools.partial(self._forget, key, shared))
        elif shared.asked != asked:
            raise KeyReused(request.idempotency_key or "")
        shared.callers += 1
        try:
            return await asyncio.shield(shared.task)
        finally:
            shared.callers -= 1
            # The acquire is shared by retries of one request; it is called off only when the last
            # of them has gone (a retry that arrives later starts afresh).
            if shared.callers == 0 and not shared.task.done():
                shared.task.cancel()
                await asyncio.wait({shared.task})  # it has left the queue when we return

    async def _adopt(
        self, found: list[tuple[LeaseRecord, SandboxPod]], attempt: str | None
    ) -> list[tuple[LeaseRecord, SandboxPod]]:
        """Hand earlier leases to a retry only after a conditional write (a renewal) on each.

        The gateway that claimed them may be un-claiming them because the first attempt's client
        went away; that un-claim is conditional on the claim's version, so exactly one of the two
        writes wins: the retry gets a lease that stays, or it gets none and acquires afresh. The
        write also files each under the retry's attempt, so its answer's leases share one
        (lease_keys.adoptable).
        """
        now = self.clock()
        renewed = [replace(lease.renewed(now, lease.ttl_seconds), attempt=attempt) for lease, _ in found]
        written = await asyncio.gather(
            *(self.backend.write_lease(s, r) for (_, s), r in zip(found, renewed, strict=True))
        )
        return [(r, s) for r, s in zip(renewed, written, strict=True) if s is not None]

    async def _acquire_rest(
        self, request: LeaseRequest, shelf: Shelf, ttl: int, earlier: list[tuple[LeaseRecord, SandboxPod]]
    ) -> Granted:
        """Claim what a retry still lacks beyond the `earlier` leases it adopted (all of it if none).

        Below its minimum, answering with what it adopted would break the minimum, so the rest is
        claimed under the same key. If that fails, what was adopted stays leased until its TTL,
        never put back warm: it may be what is left of an answer its caller holds (and released
        part of), and a lease must not vanish from under its holder.
        """
        if not earlier:
            return await self._acquire(request, shelf, ttl)
        count, least = still_to_claim(request.count, request.least, len(earlier))
        rest = await self._acquire(replace(request, count=count, min_count=least), shelf, ttl)
        return replace(rest, leases=[*earlier, *rest.leases])

    def _forget(self, key: KeyOwner, shared: _Shared, _: object) -> None:
        if self._by_idempotency_key.get(key) is shared:
            del self._by_idempotency_key[key]

    def _leases_with_key(self, idempotency_key: str, holder: str) -> list[tuple[LeaseRecord, SandboxPod]]:
        # An expired lease is not handed back: its sandbox is being reaped, so a retry gets a new one.
        now = self.clock()
        found = []
        for sandbox in self.backend.leased_with_key(holder, idempotency_key):
            lease = sandbox.lease
            if (
                lease is not None
                and sandbox.state == api.LEASE_LEASED
                and lease.idempotency_key == idempotency_key
                and lease.holder == holder
                and not lease.expired(now)
                and sandbox.key not in self._disowned
            ):
                found.append((lease, sandbox))
        return found

    async def _acquire(self, request: LeaseRequest, shelf: Shelf, ttl: int) -> Granted:
        self._check_lease_quota(request.holder, request.count)
        self._pending[request.holder] = self._pending.get(request.holder, 0) + request.count
        try:
            return await self._wait_and_claim(request, shelf, ttl)
        finally:
            left = self._pending[request.holder] - request.count
            if left:
                self._pending[request.holder] = left
            else:
                del self._pending[request.holder]

    def _check_lease_quota(self, holder: str, count: int) -> None:
        pending = self._pending.get(holder, 0)
        limit = self.quotas.max_leases_per_tenant
        if len(self._held.get(holder, ())) + pending + count > limit:
            check_leases(holder, self._held_now(holder), pending, count, self.quotas)

    def _held_now(self, holder: str) -> int:
        """The tenant's live leases, exactly: its index entries checked (and pruned) one by one."""
        now = self.clock()
        keys = self._held.get(holder, set())
        for key in list(keys):
            sandbox = self.backend.sandbox(key)
            lease = sandbox.lease if sandbox is not None else None
            if (
                sandbox is None
                or lease is None
                or sandbox.state != api.LEASE_LEASED
                or lease.holder != holder
                or lease.expired(now)
            ):
                keys.discard(key)
                self._holder_of.pop(key, None)
        if not keys:
            self._held.pop(holder, None)
        return len(keys)

    def _track_holder(self, sandbox: SandboxPod) -> None:
        lease = sandbox.lease
        holder = lease.holder if lease is not None and sandbox.state == api.LEASE_LEASED else None
        known = self._holder_of.get(sandbox.key)
        if known == holder:
            return
        if known is not None:
            keys = self._held.get(known)
            if keys is not None:
                keys.discard(sandbox.key)
                if not keys:
                    del self._held[known]
            del self._holder_of[sandbox.key]
        if holder is not None:
            self._held.setdefault(holder, set()).add(sandbox.key)
            self._holder_of[sandbox.key] = holder

    async def _wait_and_claim(self, request: LeaseRequest, shelf: Shelf, ttl: int) -> Granted:
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
            self._track_holder(sandbox)
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
            self._claims.add(task)
            task.add_done_callback(self._claims.discard)
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
                self._track_holder(result)
                continue
            self._disowned.discard(sandbox.key)
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
            self._disowned.update(s.key for s in waiter.in_flight)
            self._disowned.update(s.key for _, s in waiter.got)
        elif waiter.future.done() and not waiter.future.cancelled() and not waiter.future.exception():
            self._give_back(waiter.future.result())  # granted in the very step it was cancelled

    def _give_back(self, leases: list[tuple[LeaseRecord, SandboxPod]]) -> asyncio.Future[None]:
        """Un-claim sandboxes nobody received, in a task of its own (a cancelled caller can't wait)."""
        keys = {sandbox.key for _, sandbox in leases}
        self._disowned.update(keys)

        async def give_back() -> None:
            try:
                await asyncio.gather(*(self._unclaim(sandbox) for _, sandbox in leases))
            finally:
                self._disowned.difference_update(keys)

        task = asyncio.ensure_future(give_back())
        self._claims.add(task)
        task.add_done_callback(self._claims.discard)
        return task

    async def _unclaim(self, sandbox: SandboxPod) -> None:
        with contextlib.suppress(Exception):
            await self.backend.unclaim(sandbox)

    def _on_change(self, sandbox: SandboxPod) -> None:
        self._track_holder(sandbox)
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

    async def prefetch(self, pool: str, images: list[tuple[str, int]], ttl_seconds: int) -> list[str]:
        """Ask the runtime to warm `images` ((image, count) pairs) ahead, within quota and capacity."""
        info = self.pool(pool)
        check_prefetch([count for _, count in images], info.name, info.max_sandboxes, self.quotas)
        return [await self.backend.prefetch(info.name, image, count, ttl_seconds) for image, count in images]

    def waiting(self, pool: str) -> int:
        return sum(len(q.waiters) for (name, _), q in self._queues.items() if name == pool)

    # -- the lease's life ----------------------------------------------------------------------

    async def current(self, lease_id: str, holder: str | None = None) -> tuple[LeaseRecord, SandboxPod]:
        """The live lease and its sandbox, or UnknownName / LeaseGone / NotTheHolder saying why not."""
        sandbox = self.backend.sandbox(lease_id)
        if sandbox is None or sandbox.lease is None or sandbox.lease.id != lease_id:
            # Not (yet) a lease here: another replica may have just granted it and our watch lags
            # behind, so the source of truth decides before a holder is told its lease is unknown.
            try:
                sandbox = await self.backend.fresh(lease_id)
            except LeaseGone as gone:
                if holder is None or gone.holder == holder:
                    raise
                if gone.holder is None:
                    raise UnknownName(
                        f"no lease {lease_id!r}: it never existed or its sandbox is gone"
                    ) from None
                raise NotTheHolder(f"lease {lease_id!r} belongs to another caller") from None
        if sandbox is not None and _ended_episode(sandbox, lease_id, holder):
            raise LeaseGone(
                f"lease {lease_id!r} was released and its sandbox reset for another episode; "
                "acquire a new one"
            )
        if sandbox is None or sandbox.lease is None or sandbox.lease.id != lease_id:
            raise UnknownName(f"no lease {lease_id!r}: it never existed or its sandbox is gone")
        lease = sandbox.lease
        if holder is not None and lease.holder != holder:
            raise NotTheHolder(f"lease {lease_id!r} belongs to another caller")
        if sandbox.state == api.LEASE_RELEASED or sandbox.terminating:
            raise LeaseGone(f"lease {lease_id!r} was released; acquire a new one")
        if sandbox.state != api.LEASE_LEASED:
            raise LeaseGone(
                f"lease {lease_id!r} has ended (its sandbox is {sandbox.state}); acquire a new one"
            )
        if lease.expired(self.clock()):
            raise LeaseGone(f"lease {lease_id!r} expired; acquire a new one and renew it sooner")
        return lease, sandbox

    async def renew(self, lease_id: str, holder: str, ttl_seconds: int | None) -> LeaseRecord:
        # Read and written again after a lost write (TryAgain), at once; RENEW_ATTEMPTS lost is a LeaseError.
        retrying = AsyncRetrying(retry=retry_never, stop=stop_after_attempt(RENEW_ATTEMPTS))
        try:
            renewed: LeaseRecord = await retrying(self._renew_once, lease_id, holder, ttl_seconds)
        except RetryError:
            raise LeaseError(f"lease {lease_id!r} is being changed by someone else; retry") from None
        return renewed

    async def _renew_once(self, lease_id: str, holder: str, ttl_seconds: int | None) -> LeaseRecord:
        lease, sandbox = await self.current(lease_id, holder)
        pool = self.backend.pool(lease.pool)
        max_ttl = pool.max_ttl_seconds if pool else lease.ttl_seconds
        ttl = choose_ttl(ttl_seconds, lease.ttl_seconds, max_ttl)
        renewed = lease.renewed(self.clock(), ttl)
        if await self.backend.write_lease(sandbox, renewed) is not None:
            return renewed
        await self.backend.fresh(lease_id)  # somebody else wrote it: read and try again
        raise TryAgain

    async def release(self, lease_id: str, holder: str) -> bool:
        """Release a lease; True if this call released it, False if it had already ended."""
        try:
            _, sandbox = await self.current(lease_id, holder)
        except (UnknownName, LeaseGone):
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
    ) -> list[tuple[LeaseRecord, SandboxPod]]:
        now = self.clock()
        found = []
        for sandbox in self.backend.sandboxes(pool):
            lease = sandbox.lease
            if lease is None or sandbox.state != api.LEASE_LEASED or lease.expired(now):
                continue
            if (run is None or lease.run == run) and (holder is None or lease.holder == holder):
                found.append((lease, sandbox))
        return sorted(found, key=lambda pair: pair[0].acquired_at)


def _ended_episode(sandbox: SandboxPod, lease_id: str, holder: str | None) -> bool:
    """Whether `lease_id` names an earlier episode of `sandbox` (recycled since), asked by its holder."""
    episode = lease_episode(lease_id)
    if episode is None or episode >= sandbox.episodes:
        return False
    holders = {sandbox.lease.holder if sandbox.lease else None, (sandbox.reserved_for or (None,))[0]}
    return holder is None or holder in holders
