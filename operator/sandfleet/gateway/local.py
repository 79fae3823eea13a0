"""The embedded default: a Backend over local gVisor sandboxes (no cluster), for `sandfleet serve`."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace

from sandfleet.core import api
from sandfleet.core.leases import LeaseError, LeaseRecord
from sandfleet.core.model import LeaseSpec, SandboxPod, image_key
from sandfleet.gateway.backend import IndexedReads, PoolInfo, SandboxIndex
from sandfleet.local.pool import WarmPool
from sandfleet.local.runtime import LocalRuntime, RunscSandbox

log = logging.getLogger(__name__)

NAMESPACE = "local"
REGION = "local"
ENDED_MEMORY = 10_000  # ended leases remembered, so late calls get 410 rather than 404
MAX_SANDBOXES = 64  # the most a local pool is ever warmed to (by --warm or a prefetch)


class LocalBackend(IndexedReads):
    """One pool of warm gVisor sandboxes on this host; leases are in memory (sandboxes die with us).

    Everything runs on one event loop, so a claim is atomic by construction; resource versions
    still guard it, so the lease service treats both runtimes the same way.
    """

    def __init__(
        self,
        runtime: LocalRuntime,
        pool_name: str,
        image: str,
        warm: int,
        default_ttl_seconds: int = LeaseSpec().default_ttl_seconds,
        max_ttl_seconds: int = LeaseSpec().max_ttl_seconds,
        clock: Callable[[], float] = time.time,
        max_sandboxes: int = MAX_SANDBOXES,
    ) -> None:
        self.runtime = runtime
        self.info = PoolInfo(
            NAMESPACE,
            pool_name,
            default_ttl_seconds,
            max_ttl_seconds,
            (REGION,),
            image,
            max_sandboxes,
            other_images=False,
        )
        self.base_warm = warm
        self.clock = clock
        self.warm_pool = WarmPool(runtime, warm, on_ready=self._on_ready, on_retire=self._on_retired)
        self.index = SandboxIndex()
        self._local: dict[str, RunscSandbox] = {}
        self._ended: OrderedDict[str, SandboxPod] = OrderedDict()
        self._versions = itertools.count(1)
        self._reaper: asyncio.Task[None] | None = None
        self._prefetch_reset: asyncio.TimerHandle | None = None

    # -- life cycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        self.runtime.loss_listeners.append(self._on_lost)
        await self.runtime.start()
        self.warm_pool.start()
        self._reaper = asyncio.create_task(self._reap_forever())

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await self.warm_pool.close()
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
        if not self.warm_pool.take(self._local[sandbox.key]):
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
        self.warm_pool.put_back(self._local[sandbox.key])
        self._store(replace(current, state=api.LEASE_FREE, lease=None))

    async def release(self, sandbox: SandboxPod) -> None:
        self._end(sandbox.key, api.LEASE_RELEASED)

    def _end(self, key: str, state: str) -> None:
        """Forget a sandbox (remembering how its lease ended) and destroy it in the background."""
        current = self.index.pop(key, None)
        local = self._local.pop(key, None)
        if current is None or local is None:
            return
        ended = replace(current, state=state, resource_version=str(next(self._versions)))
        self._ended[key] = ended
        while len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)
        self.runtime.release(local)  # torn down in the background, never reused

    async def prefetch(self, pool: str, image: str, count: int, ttl_seconds: int) -> str:
        """Grow the warm pool to `count` for `ttl_seconds` (one image here: the runtime's own)."""
        if image_key(image) != image_key(self.info.image):
            raise LeaseError(
                f"the local runtime runs one image ({self.info.image}); build task images into it"
            )
        self.warm_pool.resize(min(max(self.base_warm, count), self.info.max_sandboxes))
        if self._prefetch_reset is not None:
            self._prefetch_reset.cancel()
        self._prefetch_reset = asyncio.get_running_loop().call_later(
            ttl_seconds, self.warm_pool.resize, self.base_warm
        )
        return f"{pool}:{count}"

    # -- internals -----------------------------------------------------------------------------

    def _on_ready(self, local: RunscSandbox) -> None:
        key = f"{NAMESPACE}.{local.id}"
        self._local[key] = local
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
                image_key=image_key(self.info.image),
            )
        )

    def _on_lost(self, local: RunscSandbox) -> None:
        """A sandbox died: a warm one is replaced; a leased one loses its address (calls: sandbox_lost)."""
        key = f"{NAMESPACE}.{local.id}"
        current = self.index.get(key)
        if current is None:
            return
        if current.state == api.LEASE_FREE:
            self.warm_pool.take(local)  # the pool refills behind it
            self._end(key, current.state)
            return
        # Listeners (the proxy among them) hear it at once: requests in flight end with sandbox_lost.
        self._store(replace(current, ready=False, address=None))

    def _on_retired(self, local: RunscSandbox) -> None:
        """The warm pool shrank and destroyed this ready sandbox: it is neither warm nor leasable."""
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
