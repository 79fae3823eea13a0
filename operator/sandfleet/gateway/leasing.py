"""The lease service: what the routes call to lease warm sandboxes, renew and release them.

`LeaseService` checks an acquire against its pool and quotas, then hands it to its parts: keyed
acquires (idempotent retries, gateway.keyed_acquires), each tenant's lease count
(gateway.tenant_leases), the wait queues that pair waiters with warm sandboxes (gateway.lease_queue),
and the live leases' reads, renewals and releases (gateway.live_leases).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sandfleet.core.leases import LeaseRecord, choose_ttl
from sandfleet.core.model import SandboxPod, image_key
from sandfleet.core.quotas import CapacityError, Quotas, check_batch, check_group, check_prefetch
from sandfleet.core.warm_index import Shelf
from sandfleet.gateway.backend import Backend, PoolInfo
from sandfleet.gateway.keyed_acquires import KeyedAcquires
from sandfleet.gateway.lease_errors import UnknownName
from sandfleet.gateway.lease_queue import LeaseQueues
from sandfleet.gateway.lease_requests import Granted, LeaseRequest
from sandfleet.gateway.live_leases import LiveLeases
from sandfleet.gateway.tenant_leases import TenantLeases


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
        self.quotas = quotas or Quotas()
        self.tenants = TenantLeases(backend, clock, self.quotas)
        self.queues = LeaseQueues(
            backend, clock, self.tenants.track, max_waiting, spinup_seconds, overtake_seconds
        )
        self.keyed = KeyedAcquires(backend, clock, self._acquire, self.queues.disowned)
        self.live = LiveLeases(backend, clock)
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
            return await self.keyed.acquire(request, shelf, ttl)
        return await self._acquire(request, shelf, ttl)

    async def _acquire(self, request: LeaseRequest, shelf: Shelf, ttl: int) -> Granted:
        with self.tenants.acquiring(request.holder, request.count):
            return await self.queues.wait_and_claim(request, shelf, ttl)

    def _on_change(self, sandbox: SandboxPod) -> None:
        self.tenants.track(sandbox)
        self.queues.on_change(sandbox)

    async def prefetch(self, pool: str, images: list[tuple[str, int]], ttl_seconds: int) -> list[str]:
        """Ask the runtime to warm `images` ((image, count) pairs) ahead, within quota and capacity."""
        info = self.pool(pool)
        check_prefetch([count for _, count in images], info.name, info.max_sandboxes, self.quotas)
        return [await self.backend.prefetch(info.name, image, count, ttl_seconds) for image, count in images]

    def waiting(self, pool: str) -> int:
        return self.queues.waiting(pool)

    # -- the lease's life (gateway.live_leases) ------------------------------------------------

    async def current(self, lease_id: str, holder: str | None = None) -> tuple[LeaseRecord, SandboxPod]:
        """The live lease and its sandbox, or UnknownName / LeaseGone / NotTheHolder saying why not."""
        return await self.live.current(lease_id, holder)

    async def renew(self, lease_id: str, holder: str, ttl_seconds: int | None) -> LeaseRecord:
        return await self.live.renew(lease_id, holder, ttl_seconds)

    async def release(self, lease_id: str, holder: str) -> bool:
        """Release a lease; True if this call released it, False if it had already ended."""
        return await self.live.release(lease_id, holder)

    async def release_run(self, run: str, holder: str | None) -> list[str]:
        """Release every live lease labelled with `run` (of `holder`, unless None); their ids."""
        return await self.live.release_run(run, holder)

    def leases(
        self, pool: str | None = None, run: str | None = None, holder: str | None = None
    ) -> list[tuple[LeaseRecord, SandboxPod]]:
        return self.live.leases(pool, run, holder)
