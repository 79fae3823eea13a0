"""A granted lease's life: the caller's live lease, its renewals and releases, and the lists of them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tenacity import AsyncRetrying, RetryError, TryAgain, retry_never, stop_after_attempt

from sandfleet.core import api
from sandfleet.core.leases import LeaseError, LeaseRecord, choose_ttl
from sandfleet.core.model import SandboxPod, lease_episode
from sandfleet.gateway.backend import Backend
from sandfleet.gateway.lease_errors import LeaseGone, NotTheHolder, UnknownName

RENEW_ATTEMPTS = 5  # writes of a renewal, each lost to another writer, before the caller is told to retry


class LiveLeases:
    """The leases live now over a Backend, as their holders see them: read, renewed, released, listed."""

    def __init__(self, backend: Backend, clock: Callable[[], float]) -> None:
        self.backend = backend
        self.clock = clock

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
