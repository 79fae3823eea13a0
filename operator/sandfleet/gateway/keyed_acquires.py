"""Acquires under an idempotency key: a retry joins the attempt in flight or adopts what it claimed."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Awaitable, Callable, Container
from dataclasses import dataclass, replace

from sandfleet.core import api
from sandfleet.core.lease_keys import (
    KeyOwner,
    adoptable,
    asked_otherwise,
    key_owner,
    request_fingerprint,
    still_to_claim,
)
from sandfleet.core.leases import LeaseRecord
from sandfleet.core.model import SandboxPod
from sandfleet.core.warm_index import Shelf
from sandfleet.gateway.backend import Backend
from sandfleet.gateway.lease_errors import KeyReused
from sandfleet.gateway.lease_requests import Granted, LeaseRequest


@dataclass(eq=False)
class _Shared:
    """One acquire shared by the retries of a request (same idempotency key) that await it."""

    task: asyncio.Future[Granted]
    asked: str  # the request's fingerprint: another request with the key must not join it
    callers: int = 0


class KeyedAcquires:
    """A retried request with the same idempotency key gets the same leases, never new ones.

    Per tenant (core.lease_keys.key_owner), one acquire runs per key; what it still lacks beyond
    the leases an earlier attempt claimed is acquired through `acquire` (the wait queue).
    """

    def __init__(
        self,
        backend: Backend,
        clock: Callable[[], float],
        acquire: Callable[[LeaseRequest, Shelf, int], Awaitable[Granted]],
        disowned: Container[str],
    ) -> None:
        self.backend = backend
        self.clock = clock
        self._acquire = acquire
        self._disowned = disowned  # sandboxes being given back: never adopted by a retry
        self._by_idempotency_key: dict[KeyOwner, _Shared] = {}  # per tenant: see key_owner

    async def acquire(self, request: LeaseRequest, shelf: Shelf, ttl: int) -> Granted:
        """The leases of a keyed request: those of its attempt in flight or before, else claimed anew."""
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
