"""The embedded default: a Backend over local gVisor sandboxes (no cluster), for `sandfleet serve`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from prometheus_client import Counter, Histogram

from sandfleet.core import api
from sandfleet.core.leases import LeaseError, LeaseRecord
from sandfleet.core.model import LeaseSpec, SandboxPod, image_key
from sandfleet.core.pods import STARTUP_BUCKETS, STARTUP_LABELS, STARTUP_METRIC
from sandfleet.core.quotas import CapacityError
from sandfleet.core.recycle import RecyclePolicy, recycle_decision, reserved_to_drop
from sandfleet.gateway.backend import IndexedReads, PoolInfo, SandboxIndex
from sandfleet.gateway.recycling import reset_metrics
from sandfleet.local.artifacts import ImageRef
from sandfleet.local.errors import LocalRuntimeError
from sandfleet.local.plan import demand_boots, idle_spares, prefetch_refusal, startup_phases, template_hash
from sandfleet.local.pool import WarmPool
from sandfleet.local.runtime import LocalRuntime, ResetFailed, RunscSandbox, SandboxSpec

log = logging.getLogger(__name__)

NAMESPACE = "local"
REGION = "local"
ENDED_MEMORY = 10_000  # ended leases remembered, so late calls get 410 rather than 404
MAX_SANDBOXES = 64  # the most the local runtime ever holds, warm and leased, over all its images


# Why a reset sandbox is not warm again: its restore failed, its probe did not match the golden
# sandbox's, or it aged past the pool's bound while resetting; "recycled" when it is.
RESET_RESULTS = ("recycled", "restore_failed", "probe_failed", "retired")
Reserve = tuple[str, str, str]  # (holder, run, image key): who may lease a reset sandbox next


def startup_histogram() -> Histogram:
    """The cluster's spin-up histogram (same name, labels and buckets), for one app's registry."""
    return Histogram(
        STARTUP_METRIC,
        "Sandbox spin-up by phase (scheduled, started, ready, total), as the runtime timed it.",
        STARTUP_LABELS,
        buckets=STARTUP_BUCKETS,
        registry=None,
    )


@dataclass(eq=False)
class _Life:
    """A runsc sandbox's service so far: when it first became warm, and episodes leased on it."""

    born_at: float
    episodes: int = 0


@dataclass(eq=False)
class _Served:
    """One image the backend serves: its warm pool, its standing warm count and its prefetch."""

    image: ImageRef
    spec: SandboxSpec
    pool: WarmPool
    base_warm: int
    template_hash: str
    target: int = 0  # the warm pool's size now: base_warm, or a prefetch's count while it lasts
    reset: asyncio.TimerHandle | None = None
    demand_booting: int = 0  # boots for callers waiting beyond the warm count, in flight


class LocalBackend(IndexedReads):
    """One pool of warm gVisor sandboxes on this host, of one or more images; leases are in memory.

    The first image is the pool's own (its template's); every image is kept `warm`, leased by
    image as on a cluster, prefetched within the runtime's capacity, and booted on demand when
    callers wait for more than are warm. Everything runs on one event loop, so a claim is atomic
    by construction; resource versions still guard it, so the lease service treats both runtimes
    the same way.
    """

    def __init__(
        self,
        runtime: LocalRuntime,
        pool_name: str,
        images: Sequence[ImageRef],
        warm: int,
        default_ttl_seconds: int = LeaseSpec().default_ttl_seconds,
        max_ttl_seconds: int = LeaseSpec().max_ttl_seconds,
        clock: Callable[[], float] = time.time,
        max_sandboxes: int = MAX_SANDBOXES,
        startup: Histogram | None = None,
        recycle: RecyclePolicy | None = None,
        clean_scoring: bool = False,
        commands_as_image_user: bool = False,
    ) -> None:
        if not images:
            raise ValueError("a local pool serves at least one image")
        tags = [image.tag for image in images]
        if len(set(tags)) != len(tags):
            raise LocalRuntimeError(f"two images share a tag ({', '.join(tags)}): leases name images by tag")
        if warm * len(images) > max_sandboxes:
            raise LocalRuntimeError(
                f"{warm} warm of each of {len(images)} images exceeds the {max_sandboxes} sandboxes "
                "the local runtime holds"
            )
        self.runtime = runtime
        self.info = PoolInfo(
            NAMESPACE,
            pool_name,
            default_ttl_seconds,
            max_ttl_seconds,
            (REGION,),
            images[0].tag,
            max_sandboxes,
            other_images=False,
            served_images=tuple(tags[1:]),
            clean_scoring=clean_scoring or commands_as_image_user,
            commands_as_image_user=commands_as_image_user,
        )
        self.base_warm = warm
        self.clock = clock
        self.startup = startup or startup_histogram()
        # Recycling pools restore every sandbox from a golden snapshot, and reset it the same way.
        self.recycle = recycle
        self._create = runtime.create_restored if recycle is not None else runtime.create
        self.resets, self.reset_seconds = reset_metrics(
            "How long a reset took: teardown, restore from the golden snapshot, rekey and probe."
        )
        if recycle is not None:
            for result in RESET_RESULTS:  # exported from the start, at zero
                self.resets.labels(pool_name, result)
        self.served: dict[str, _Served] = {}  # by image key
        for image in images:
            spec = SandboxSpec(image=image)
            served = _Served(
                image=image,
                spec=spec,
                pool=WarmPool(runtime, warm, spec=spec, create=self._create),
                base_warm=warm,
                template_hash=template_hash(image.digest, spec.limits, spec.env),
                target=warm,
            )
            served.pool.on_ready = functools.partial(self._on_ready, served=served)
            served.pool.on_retire = self._on_retired
            self.served[image_key(image.tag)] = served
        self.default = self.served[image_key(images[0].tag)]
        self.warm_pool = self.default.pool  # the pool's own image's
        self.index = SandboxIndex()
        self._local: dict[str, RunscSandbox] = {}
        # Warm sandboxes booted on demand, outside any warm pool, and since when each is free.
        self._spares: dict[str, float] = {}
        self._from_spares: set[str] = set()  # leased ones that came from there (un-claim returns them)
        self._ended: OrderedDict[str, SandboxPod] = OrderedDict()
        self._versions = itertools.count(1)
        self._reaper: asyncio.Task[None] | None = None
        self._boots: set[asyncio.Task[None]] = set()
        # Recycling: each runsc sandbox's service (by id), reset sandboxes waiting for their run's
        # next lease (and since when), leases served by one of those, and resets under way.
        self._lives: dict[str, _Life] = {}
        self._reserved: dict[Reserve, deque[tuple[RunscSandbox, float]]] = {}
        self._bound: dict[str, Reserve] = {}
        self._binding: set[str] = set()
        self._resets: set[asyncio.Task[None]] = set()
        self._names = itertools.count(2)

    @property
    def collectors(self) -> tuple[Histogram | Counter, ...]:
        """The metrics this backend exports (spin-up, and resets of recycling pools)."""
        return (self.startup, self.resets, self.reset_seconds)

    # -- life cycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        self.runtime.loss_listeners.append(self._on_lost)
        await self.runtime.start()
        for served in self.served.values():
            await self.runtime.add_image(served.image)
        for served in self.served.values():
            served.pool.start()
        self._reaper = asyncio.create_task(self._reap_forever())

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for task in [*self._boots, *self._resets]:
            task.cancel()
        await asyncio.gather(*self._boots, *self._resets, return_exceptions=True)
        for served in self.served.values():
            if served.reset is not None:
                served.reset.cancel()
            await served.pool.close()
        await self.runtime.close()

    def ready(self) -> bool:
        return self.warm_pool.ready_count > 0 or self.base_warm == 0

    # -- Backend: reads ------------------------------------------------------------------------

    def pool(self, name: str) -> PoolInfo | None:
        return self.info if name == self.info.name else None

    def pools(self) -> list[PoolInfo]:
        return [self.info]

    def sandbox(self, lease_id: str) -> SandboxPod | None:
        return self.index.get(lease_id) or self._ended.get(lease_id)

    async def fresh(self, lease_id: str) -> SandboxPod | None:
        return self.sandbox(lease_id)

    # -- Backend: writes -----------------------------------------------------------------------

    async def claim(self, sandbox: SandboxPod, lease: LeaseRecord) -> SandboxPod | None:
        current = self.index.get(sandbox.key)
        if current is None or current.resource_version != sandbox.resource_version:
            return None
        if sandbox.key in self._binding:
            return None
        reserve = self._reserve_of(lease, current.image_key)
        if reserve in self._reserved:
            # A sandbox its run's last episode left, reset clean: it serves this lease instead.
            bound = await self._bind_reserved(current, reserve, lease)
            if bound is not None or self.index.get(sandbox.key) is not current:
                return bound
        if not self._take(sandbox.key):
            return None
        self._life(self._local[sandbox.key]).episodes += 1
        return self._store(replace(current, state=api.LEASE_LEASED, lease=lease))

    async def write_lease(self, sandbox: SandboxPod, lease: LeaseRecord) -> SandboxPod | None:
        current = self.index.get(sandbox.key)
        if current is None or current.resource_version != sandbox.resource_version:
            return None
        return self._store(replace(current, lease=lease))

    async def unclaim(self, sandbox: SandboxPod) -> None:
        current = self.index.get(sandbox.key)
        if current is None or current.resource_version != sandbox.resource_version:
            return  # written since (a retry adopted it): the lease stays
        reserve = self._bound.pop(sandbox.key, None)
        if reserve is not None:
            # A reset sandbox nobody received: it waits for its run again (its name goes with it).
            local = self._local.pop(sandbox.key)
            del self.index[sandbox.key]
            self._life(local).episodes -= 1
            self._reserved.setdefault(reserve, deque()).appendleft((local, self.clock()))
            return
        if sandbox.key in self._from_spares:
            self._from_spares.discard(sandbox.key)
            self._spares[sandbox.key] = self.clock()
        else:
            self.served[current.image_key].pool.put_back(self._local[sandbox.key])
        self._store(replace(current, state=api.LEASE_FREE, lease=None))

    async def release(self, sandbox: SandboxPod) -> None:
        current, local = self.index.get(sandbox.key), self._local.get(sandbox.key)
        if current is not None and local is not None and current.lease is not None:
            life = self._life(local)
            lease = current.lease
            decision = recycle_decision(
                self.recycle, run=lease.run, episodes=life.episodes, born_at=life.born_at, now=self.clock()
            )
            if decision.recycle:
                self._end(sandbox.key, api.LEASE_RELEASED, destroy=False)
                reserve = self._reserve_of(lease, current.image_key)
                task = asyncio.get_running_loop().create_task(self._reset(local, reserve))
                self._resets.add(task)
                task.add_done_callback(self._resets.discard)
                return
            if self.recycle is not None:
                log.debug("sandbox %s is not recycled: %s", local.id, decision.reason)
        self._end(sandbox.key, api.LEASE_RELEASED)

    def _end(self, key: str, state: str, destroy: bool = True) -> None:
        """Forget a sandbox (remembering how its lease ended) and destroy it in the background."""
        current = self.index.pop(key, None)
        local = self._local.pop(key, None)
        self._spares.pop(key, None)
        self._from_spares.discard(key)
        self._bound.pop(key, None)
        if current is None or local is None:
            return
        ended = replace(current, state=state, resource_version=str(next(self._versions)))
        self._ended[key] = ended
        while len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)
        if destroy:
            self._destroy(local)  # torn down in the background, never reused

    def _destroy(self, local: RunscSandbox) -> None:
        self._lives.pop(local.id, None)
        self.runtime.release(local)

    # -- recycling -----------------------------------------------------------------------------

    def _life(self, local: RunscSandbox) -> _Life:
        return self._lives.setdefault(local.id, _Life(born_at=self.clock()))

    @staticmethod
    def _reserve_of(lease: LeaseRecord, image: str) -> Reserve:
        # A sandbox is reused only by its own holder's same run, on the same image.
        return (lease.holder, lease.run or "", image)

    def _next_name(self, local: RunscSandbox) -> str:
        """A name never used before: each episode's lease id, and so its token, is its own."""
        return f"{local.id}-{next(self._names)}"

    async def _reset(self, local: RunscSandbox, reserve: Reserve) -> None:
        """Reset an ended episode's sandbox in place; warm for its run if clean, destroyed otherwise."""
        served = self.served[reserve[2]]
        life = self._life(local)
        started = time.monotonic()
        problems: list[str] = []
        try:
            golden = await self.runtime.golden(served.spec)
            try:
                await self.runtime.reset(local, golden, self._next_name(local))
            except ResetFailed:
                raise
            except LocalRuntimeError:
                self.runtime.forget_golden(golden)  # the next sandbox boots a new one
                raise
        except ResetFailed as failed:
            problems, result = failed.problems, "probe_failed"
        except LocalRuntimeError as error:
            problems, result = [str(error)], "restore_failed"
        else:
            decision = recycle_decision(
                self.recycle,
                run=reserve[1],
                episodes=life.episodes,
                born_at=life.born_at,
                now=self.clock(),
                probe=problems,
            )
            result = "recycled" if decision.recycle else "retired"
        self.resets.labels(self.info.name, result).inc()
        self.reset_seconds.labels(self.info.name).observe(time.monotonic() - started)
        if result != "recycled":
            # Never handed out: the runtime destroys it (a failed reset already has).
            log.warning("sandbox %s was not recycled (%s): %s", local.id, result, "; ".join(problems))
            self._destroy(local)
            return
        self._reserved.setdefault(reserve, deque()).append((local, self.clock()))

    async def _bind_reserved(
        self, current: SandboxPod, reserve: Reserve, lease: LeaseRecord
    ) -> SandboxPod | None:
        """Serve `lease` (leasing warm `current`) with a reset sandbox of its run instead.

        The lease keeps the name the lease service chose (its id and its token's); the reset
        sandbox takes it, and the fresh sandbox behind it takes a new one and stays warm. None if
        the reset sandbox did not answer (it is destroyed; the caller falls back to `current`).
        """
        key = current.key
        waiting = self._reserved[reserve]
        local, _ = waiting.popleft()
        if not waiting:
            del self._reserved[reserve]
        fresh = self._local[key]
        self._binding.add(key)
        try:
            try:
                await self.runtime.rekey(local, current.name)
            except LocalRuntimeError as error:
                log.warning("reset sandbox %s did not take its lease (%s): destroyed", local.id, error)
                self._destroy(local)
                return None
            try:
                await self.runtime.rekey(fresh, self._next_name(fresh))
                renamed = True
            except LocalRuntimeError as error:
                log.warning("warm sandbox %s could not be renamed (%s): destroyed", fresh.id, error)
                renamed = False
        finally:
            self._binding.discard(key)
        if self.index.get(key) is not current:
            # Its warm sandbox died meanwhile: the lease service sees the change and tries again.
            self._reserved.setdefault(reserve, deque()).appendleft((local, self.clock()))
            return None
        self._move_fresh(key, fresh, renamed)
        self._local[key] = local
        self._bound[key] = reserve
        self._life(local).episodes += 1
        return self._store(
            replace(
                current,
                state=api.LEASE_LEASED,
                lease=lease,
                address=local.address,
                port=local.port,
                image_digest=local.image_digest or current.image_digest,
            )
        )

    def _move_fresh(self, key: str, fresh: RunscSandbox, renamed: bool) -> None:
        """The warm sandbox behind `key` stays warm under its new name (or is destroyed)."""
        spare_since = self._spares.pop(key, None)
        if not renamed:
            if spare_since is None:
                self._take(key)  # out of its warm pool, which refills
            self._destroy(fresh)
            return
        new_key = f"{NAMESPACE}.{fresh.name}"
        if spare_since is not None:
            self._spares[new_key] = spare_since
        self._local[new_key] = fresh
        current = self.index[key]
        self._store(replace(current, name=fresh.name, state=api.LEASE_FREE, lease=None))

    def _reserved_count(self) -> int:
        return sum(len(waiting) for waiting in self._reserved.values()) + len(self._resets)

    def _drop_reserved(self, now: float) -> None:
        """Destroy reset sandboxes their run no longer wants (idle too long) or that grew too old."""
        if self.recycle is None or not self._reserved:
            return
        times = {
            local.id: (self._life(local).born_at, since)
            for waiting in self._reserved.values()
            for local, since in waiting
        }
        drop = set(reserved_to_drop(times, self.recycle, now))
        if not drop:
            return
        for reserve, waiting in list(self._reserved.items()):
            kept = deque(entry for entry in waiting if entry[0].id not in drop)
            for local, _ in waiting:
                if local.id in drop:
                    self._destroy(local)
            if kept:
                self._reserved[reserve] = kept
            else:
                del self._reserved[reserve]

    async def prefetch(self, pool: str, image: str, count: int, ttl_seconds: int) -> str:
        """Keep `count` of `image` warm for `ttl_seconds` (then its standing `--warm` again)."""
        served = self.served.get(image_key(image))
        if served is None:
            raise LeaseError(
                f"the local runtime does not serve image {image!r} (it serves "
                f"{', '.join(s.image.tag for s in self.served.values())}): restart "
                "`sandfleet serve --local` with `--image LAYOUT:TAG` for each image to serve"
            )
        targets = {s.image.tag: s.target for s in self.served.values()}
        leased = sum(1 for s in self.index.values() if s.leased) + self._reserved_count()
        refusal = prefetch_refusal(targets, served.image.tag, count, leased, self.info.max_sandboxes)
        if refusal is not None:
            raise CapacityError("prefetch_too_large", refusal)
        self._resize(served, max(served.base_warm, count))
        if served.reset is not None:
            served.reset.cancel()
        served.reset = asyncio.get_running_loop().call_later(
            ttl_seconds, self._resize, served, served.base_warm
        )
        return f"{pool}:{served.image.tag}:{count}"

    def demand(self, pool: str, key: str, waiting: int) -> None:
        """Callers wait for `waiting` sandboxes of image `key`: boot what the warm ones cannot cover."""
        served = self.served.get(key)
        if served is None or pool != self.info.name or waiting <= 0:
            return
        warm = len(self.warm(pool, key))
        booting = served.pool.creating_count + served.demand_booting
        held = (
            len(self._local)
            + self._reserved_count()
            + sum(s.pool.creating_count + s.demand_booting for s in self.served.values())
        )
        for _ in range(demand_boots(waiting, warm, booting, held, self.info.max_sandboxes)):
            served.demand_booting += 1
            task = asyncio.get_running_loop().create_task(self._boot_spare(served))
            self._boots.add(task)
            task.add_done_callback(self._boots.discard)

    # -- internals -----------------------------------------------------------------------------

    def _resize(self, served: _Served, size: int) -> None:
        served.target = size
        served.pool.resize(size)

    def _take(self, key: str) -> bool:
        """Take a warm sandbox out of its warm pool (or the spares); False if it is no longer there."""
        if key in self._spares:
            del self._spares[key]
            self._from_spares.add(key)
            return True
        current = self.index.get(key)
        local = self._local.get(key)
        if current is None or local is None:
            return False
        return self.served[current.image_key].pool.take(local)

    async def _boot_spare(self, served: _Served) -> None:
        try:
            local = await self._create(served.spec)
        except LocalRuntimeError as error:
            log.warning("booting a sandbox on demand failed: %s", error)
            return
        finally:
            served.demand_booting -= 1
        self._spares[f"{NAMESPACE}.{local.name}"] = self.clock()
        self._on_ready(local, served)

    def _on_ready(self, local: RunscSandbox, served: _Served) -> None:
        key = f"{NAMESPACE}.{local.name}"
        self._local[key] = local
        self._life(local)
        for phase, seconds in startup_phases(local.timings).items():
            self.startup.labels(self.info.name, REGION, phase).observe(seconds)
        self._store(
            SandboxPod(
                namespace=NAMESPACE,
                name=local.name,
                pool=self.info.name,
                region=REGION,
                resource_version="0",
                state=api.LEASE_FREE,
                ready=True,
                terminating=False,
                address=local.address,
                port=local.port,
                lease=None,
                # When its creation began (the runtime timed it), so the lease service can tell
                # how much of a cold acquire's wait was this sandbox booting.
                created_at=self.clock() - local.timings.get("total_s", 0.0),
                image_key=image_key(served.image.tag),
                image_digest=local.image_digest or served.image.digest,
                template_hash=served.template_hash,
            )
        )

    def _on_lost(self, local: RunscSandbox) -> None:
        """A sandbox died: a warm one is replaced; a leased one loses its address (calls: sandbox_lost)."""
        for reserve, waiting in list(self._reserved.items()):
            if any(entry[0] is local for entry in waiting):
                kept = deque(entry for entry in waiting if entry[0] is not local)
                if kept:
                    self._reserved[reserve] = kept
                else:
                    del self._reserved[reserve]
                self._destroy(local)
                return
        key = f"{NAMESPACE}.{local.name}"
        current = self.index.get(key)
        if current is None:
            return
        if current.state == api.LEASE_FREE:
            self._take(key)  # a warm pool's refills behind it
            self._end(key, current.state)
            return
        # Listeners (the proxy among them) hear it at once: requests in flight end with sandbox_lost.
        self._store(replace(current, ready=False, address=None))

    def _on_retired(self, local: RunscSandbox) -> None:
        """A warm pool shrank and destroyed this ready sandbox: it is neither warm nor leasable."""
        key = f"{NAMESPACE}.{local.name}"
        self.index.pop(key, None)
        self._local.pop(key, None)
        self._lives.pop(local.id, None)

    def _store(self, sandbox: SandboxPod) -> SandboxPod:
        return self.index.put(replace(sandbox, resource_version=str(next(self._versions))))

    async def _reap_forever(self) -> None:
        """Destroy sandboxes whose lease expired: an expired lease's sandbox is never handed out."""
        while True:
            await asyncio.sleep(1.0)
            now = self.clock()
            for sandbox in list(self.index.values()):
                if sandbox.lease is not None and sandbox.lease.expired(now):
                    log.info("lease %s expired; destroying its sandbox", sandbox.key)
                    self._end(sandbox.key, sandbox.state)  # stays "leased": callers hear "expired"
            for key in idle_spares(self._spares, now):
                self._end(key, api.LEASE_FREE)  # booted for callers served meanwhile: not warm stock
            self._drop_reserved(now)
