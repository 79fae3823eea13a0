"""The embedded default: a Backend over local gVisor sandboxes (no cluster), for `sandfleet serve`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from prometheus_client import Histogram

from sandfleet.core import api
from sandfleet.core.leases import LeaseError, LeaseRecord
from sandfleet.core.model import LeaseSpec, SandboxPod, image_key
from sandfleet.core.pods import STARTUP_BUCKETS, STARTUP_LABELS, STARTUP_METRIC
from sandfleet.core.quotas import CapacityError
from sandfleet.gateway.backend import IndexedReads, PoolInfo, SandboxIndex
from sandfleet.local.errors import LocalRuntimeError
from sandfleet.local.plan import demand_boots, idle_spares, prefetch_refusal, startup_phases, template_hash
from sandfleet.local.pool import WarmPool
from sandfleet.local.runtime import LocalRuntime, RunscSandbox, SandboxSpec
from sandfleet.local.tools import ImageRef

log = logging.getLogger(__name__)

NAMESPACE = "local"
REGION = "local"
ENDED_MEMORY = 10_000  # ended leases remembered, so late calls get 410 rather than 404
MAX_SANDBOXES = 64  # the most the local runtime ever holds, warm and leased, over all its images


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
        )
        self.base_warm = warm
        self.clock = clock
        self.startup = startup or startup_histogram()
        self.served: dict[str, _Served] = {}  # by image key
        for image in images:
            spec = SandboxSpec(image=image)
            served = _Served(
                image=image,
                spec=spec,
                pool=WarmPool(runtime, warm, spec=spec),
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
        for task in list(self._boots):
            task.cancel()
        await asyncio.gather(*self._boots, return_exceptions=True)
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
        if not self._take(sandbox.key):
            return None
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
        if sandbox.key in self._from_spares:
            self._from_spares.discard(sandbox.key)
            self._spares[sandbox.key] = self.clock()
        else:
            self.served[current.image_key].pool.put_back(self._local[sandbox.key])
        self._store(replace(current, state=api.LEASE_FREE, lease=None))

    async def release(self, sandbox: SandboxPod) -> None:
        self._end(sandbox.key, api.LEASE_RELEASED)

    def _end(self, key: str, state: str) -> None:
        """Forget a sandbox (remembering how its lease ended) and destroy it in the background."""
        current = self.index.pop(key, None)
        local = self._local.pop(key, None)
        self._spares.pop(key, None)
        self._from_spares.discard(key)
        if current is None or local is None:
            return
        ended = replace(current, state=state, resource_version=str(next(self._versions)))
        self._ended[key] = ended
        while len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)
        self.runtime.release(local)  # torn down in the background, never reused

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
        leased = sum(1 for s in self.index.values() if s.leased)
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
        held = len(self._local) + sum(s.pool.creating_count + s.demand_booting for s in self.served.values())
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
            local = await self.runtime.create(served.spec)
        except LocalRuntimeError as error:
            log.warning("booting a sandbox on demand failed: %s", error)
            return
        finally:
            served.demand_booting -= 1
        self._spares[f"{NAMESPACE}.{local.id}"] = self.clock()
        self._on_ready(local, served)

    def _on_ready(self, local: RunscSandbox, served: _Served) -> None:
        key = f"{NAMESPACE}.{local.id}"
        self._local[key] = local
        for phase, seconds in startup_phases(local.timings).items():
            self.startup.labels(self.info.name, REGION, phase).observe(seconds)
        self._store(
            SandboxPod(
                namespace=NAMESPACE,
                name=local.id,
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
        key = f"{NAMESPACE}.{local.id}"
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
        key = f"{NAMESPACE}.{local.id}"
        self.index.pop(key, None)
        self._local.pop(key, None)

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
