"""One gateway over several member clusters: a KubeBackend each, one shared index, writes to the holder."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from prometheus_client.registry import Collector
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_fixed

from sandfleet.core.fleet import MemberHealth, MemberOffer, member_shares, observe, split_count, withdraw
from sandfleet.core.leases import LeaseRecord
from sandfleet.core.model import SandboxPod, lease_cluster, sandbox_key
from sandfleet.gateway.backend import IndexedReads, PoolInfo, RuntimeAway, SandboxIndex
from sandfleet.gateway.kube import KubeBackend
from sandfleet.gateway.lease_errors import LeaseGone, SandboxWithdrawn
from sandfleet.gateway.metrics import ClusterUp
from sandfleet.gateway.recycling import AgentResets
from sandfleet.kube.api_calls import KubeClient
from sandfleet.kube.config import ApiClient
from sandfleet.kube.errors import KubeError

log = logging.getLogger(__name__)

# A member whose apiserver has not answered (or whose watches have been down) this long is lost:
# its warm sandboxes are withdrawn, so acquires go to the others, and its leases answer 410 at once
# instead of waiting on its apiserver.
LOST_AFTER_SECONDS = 3.0
CHECK_EVERY_SECONDS = 0.5
# A member's apiserver must answer a cheap read this fast: a partition shows as silence, not as
# an error, and a watch can stay open on a peer that no longer answers.
PROBE_SECONDS = 1.0
START_RETRY_SECONDS = 2.0
# How long a chore waits on one write to a member (a lost lease's release, a share) before moving on.
RELEASE_SECONDS = 5.0
# Shares are given out once every member has started, or this long after the gateway began.
SHARE_AFTER_SECONDS = 30.0

T = TypeVar("T")


@dataclass
class Member:
    """One member cluster as the fleet gateway sees it."""

    name: str
    backend: KubeBackend
    health: MemberHealth = field(default_factory=MemberHealth)
    started: bool = False
    # The leases it held when it was lost: their holders were told so (410), so they end for good,
    # released once it is back, even though its own ledger kept them.
    ended: set[str] = field(default_factory=set)
    # Set while it is lost: what a call on it waits on besides its own answer.
    lost_event: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def lost(self) -> bool:
        return self.health.lost

    @property
    def serving(self) -> bool:
        return self.started and not self.health.lost


class MemberLost(LeaseGone):
    """A lease on a member cluster the gateway cannot reach: lost with it (its holder sees 410)."""

    def __init__(self, message: str, holder: str | None = None) -> None:
        super().__init__(message)
        self.holder = holder


class NoMemberServes(RuntimeAway):
    """Every member cluster is lost or still starting (a 503 to retry)."""


class FleetBackend(IndexedReads):
    """A Backend over the pools of one namespace in several member clusters.

    Each member is a KubeBackend whose sandboxes carry its name (`SandboxPod.cluster`, so lease ids
    say which member holds them), filed in one shared index: a shelf holds every member's warm
    sandboxes of a pool and image, and an acquire spills from a member that is short to the others
    with no routing of its own. Writes go to the member that holds the sandbox. Losing a member
    withdraws its warm sandboxes, ends its leases with a clear error and gives its share of every
    pool's warm target to the others; its own ledgers keep its leases, so nothing is leased twice
    when it comes back, and the ones lost with it are released then.
    """

    def __init__(
        self,
        namespace: str,
        connects: Mapping[str, Callable[[], Awaitable[ApiClient]]],
        resets: AgentResets | None = None,
        clock: Callable[[], float] = time.monotonic,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        if not connects:
            raise ValueError("a fleet needs at least one member cluster")
        self.namespace = namespace
        self.weights = dict(weights or {})  # member -> its weight in each pool's split (default 1)
        self.index = SandboxIndex()
        self.clock = clock
        self.members = {
            name: Member(name, KubeBackend(namespace, connect, resets=resets, cluster=name, index=self.index))
            for name, connect in connects.items()
        }
        self.home = next(iter(self.members.values())).backend  # reviews, policies and peers live there
        self.synced = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._chores: asyncio.Task[None] | None = None
        self._born = clock()

    # -- the members ---------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether some member serves (a lost one costs only its own sandboxes)."""
        return any(m.serving and m.backend.connected for m in self.members.values())

    @property
    def kube(self) -> KubeClient:
        """The home member's client (the run policies and the replicas' peers live there)."""
        return self.home.kube

    def replicas(self) -> int:
        """1: replicas of a fleet gateway do not share out the warm sandboxes among themselves."""
        return 1

    def metrics(self) -> Collector:
        """`sandfleet_gateway_member_up{cluster}`: 1 while a member serves, 0 while lost or starting."""
        return ClusterUp(lambda: {name: member.serving for name, member in self.members.items()})

    async def start(self, sync_timeout: float = 60.0) -> None:
        """Start every member; returns once one has synced (a member that cannot start yet keeps trying)."""
        members = self.members.values()
        self._tasks = [asyncio.create_task(self._start_member(m, sync_timeout)) for m in members]
        self._tasks.append(asyncio.create_task(self._watch_members()))
        await asyncio.wait_for(self.synced.wait(), timeout=sync_timeout)

    async def _start_member(self, member: Member, sync_timeout: float) -> None:
        async def stop_before_retrying(attempt: RetryCallState) -> None:
            error = attempt.outcome.exception() if attempt.outcome is not None else None
            log.warning("member cluster %s did not start (%s); retrying", member.name, error)
            with contextlib.suppress(Exception):
                await member.backend.stop()

        retrying = AsyncRetrying(
            retry=retry_if_exception_type(Exception),  # unreachable at start: the others serve meanwhile
            wait=wait_fixed(START_RETRY_SECONDS),
            before_sleep=stop_before_retrying,
        )
        await retrying(member.backend.start, sync_timeout)
        member.started = True
        self.synced.set()

    async def _watch_members(self) -> None:
        while True:
            try:
                await self._look()
            except Exception:  # one bad look must not stop the watching
                log.exception("looking at the member clusters failed; looking again")
            await asyncio.sleep(CHECK_EVERY_SECONDS)

    async def _look(self) -> None:
        """Probe every started member at once; bring health and shelves up to date, then the rest."""
        started = [m for m in self.members.values() if m.started]
        answers = await asyncio.gather(*(self._answers(m) for m in started))
        now = self.clock()
        for member, answered in zip(started, answers, strict=True):
            self._check(member, answered and member.backend.connected, now)
        # Writes to the members run beside the looking, so a slow member never delays a loss.
        if self._chores is None or self._chores.done():
            self._chores = asyncio.create_task(self._do_chores(now))

    async def _do_chores(self, now: float) -> None:
        """Release what was lost with a member that is back; tell the members their shares."""
        try:
            for member in self.members.values():
                if member.ended and member.serving:
                    await self._end_lost_leases(member)
            # Not before every member has had its chance to start: each would take the whole
            # target and give most of it back a moment later.
            if all(m.started for m in self.members.values()) or now - self._born >= SHARE_AFTER_SECONDS:
                await self._share_out()
        except Exception:
            log.exception("a chore on the member clusters failed; trying again at the next look")

    async def _share_out(self) -> None:
        """Tell each serving member its share of every pool's warm target, where it holds another.

        A pool's shares follow the members' weights, each held to the room its operator reports
        (`member_shares`), so a member short of nodes gives the rest of its part to the others.
        """
        serving = [m for m in self.members.values() if m.serving]
        names = sorted({info.name for m in serving for info in m.backend.pools()})
        for pool in names:
            infos = {m.name: info for m in serving if (info := m.backend.pool(pool)) is not None}
            offers = {
                name: MemberOffer(self.weights.get(name, 1.0), info.room) for name, info in infos.items()
            }
            replicas = max(info.replicas for info in infos.values())
            for name, share in member_shares(replicas, offers).items():
                if infos[name].fleet_share == share:
                    continue
                try:
                    await asyncio.wait_for(
                        self.members[name].backend.set_fleet_share(pool, share), RELEASE_SECONDS
                    )
                except Exception as error:  # tried again at the next look
                    log.warning("could not give member %s its share of pool %s: %s", name, pool, error)

    @staticmethod
    async def _answers(member: Member) -> bool:
        """Whether its apiserver answers a cheap read within PROBE_SECONDS."""
        try:
            await asyncio.wait_for(member.backend.kube.json("GET", "/version"), PROBE_SECONDS)
        except Exception:
            return False
        return True

    async def _end_lost_leases(self, member: Member) -> None:
        """Release what was lost with `member` now that it is back (each tried again until it lands)."""
        for lease_id in sorted(member.ended):
            found = self.index.get(sandbox_key(lease_id))
            if found is None or found.lease is None or found.lease.id != lease_id or not found.leased:
                member.ended.discard(lease_id)  # already gone, released or expired there
                continue
            try:
                await asyncio.wait_for(member.backend.release(found), RELEASE_SECONDS)
            except Exception as error:  # its apiserver may still be settling: next look
                log.warning("could not yet release %s, lost with member %s: %s", lease_id, member.name, error)
                return
            member.ended.discard(lease_id)

    def _check(self, member: Member, connected: bool, now: float) -> None:
        self._set_health(member, observe(member.health, connected, now, LOST_AFTER_SECONDS))

    def _set_health(self, member: Member, health: MemberHealth) -> None:
        """Its new health, and its warm sandboxes onto or off the shelves to match."""
        before, member.health = member.health, health
        if health.lost and not before.lost:
            member.lost_event.set()  # calls waiting on it end now
            log.warning("member cluster %s lost: its warm sandboxes withdrawn, its leases end", member.name)
            held = self._sandboxes_of(member)
            member.ended |= {s.lease.id for s in held if s.lease is not None and s.leased}
        elif before.lost and not health.lost:
            member.lost_event = asyncio.Event()
            log.warning("member cluster %s is back", member.name)
        if before.shelved and not health.shelved:
            for sandbox in self._sandboxes_of(member):
                self.index.shelves.remove(sandbox)
        elif health.shelved and not before.shelved:
            # Back on the shelves as last read; a watch that broke meanwhile relists and corrects them.
            log.info("member cluster %s answers again: its warm sandboxes back on the shelves", member.name)
            for sandbox in self._sandboxes_of(member):
                self.index.put(sandbox)  # a waiting acquire wakes for it

    def _sandboxes_of(self, member: Member) -> list[SandboxPod]:
        return [s for s in self.index.in_pool() if s.cluster == member.name]

    async def stop(self) -> None:
        tasks = [*self._tasks, *([self._chores] if self._chores is not None else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for member in self.members.values():
            if member.started:
                await member.backend.stop()

    async def _unless_lost(self, member: Member, call: Awaitable[T], lost: Callable[[], Exception]) -> T:
        """`call`'s answer, or `lost()` raised as soon as `member` is lost (a partition never answers)."""
        task = asyncio.ensure_future(call)
        if member.lost:
            task.cancel()
            raise lost()
        watching = asyncio.ensure_future(member.lost_event.wait())
        try:
            await asyncio.wait({task, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
        if task.done():
            return task.result()
        task.cancel()
        raise lost()

    def _member_of(self, sandbox: SandboxPod) -> Member:
        member = self.members.get(sandbox.cluster)
        if member is None:
            raise LookupError(f"sandbox {sandbox.key!r} names no member cluster of this fleet")
        return member

    def _lost(self, lease_id: str, member: Member, end: bool = False) -> Callable[[], MemberLost]:
        """MemberLost for `lease_id`; with `end`, the lease is also released once the member is back."""

        def lost() -> MemberLost:
            if end:
                member.ended.add(lease_id)
            found = self.index.get(sandbox_key(lease_id))
            held = found.lease if found is not None and found.lease is not None else None
            return MemberLost(
                f"lease {lease_id!r} is on member cluster {member.name!r}, which the gateway cannot "
                "reach: the lease is lost with it; acquire a new one (the other members serve)",
                holder=held.holder if held is not None and held.id == lease_id else None,
            )

        return lost

    # -- Backend: reads (the shared index) ---------------------------------------------------

    def pool(self, name: str) -> PoolInfo | None:
        """The pool as the serving members hold it together: their regions, the sum of their maxima."""
        self._some_member_serves()
        found = [info for m in self.members.values() if m.serving and (info := m.backend.pool(name))]
        if not found:
            return None
        regions = tuple(dict.fromkeys(region for info in found for region in info.regions))
        return dataclasses.replace(
            found[0], regions=regions, max_sandboxes=sum(info.max_sandboxes for info in found)
        )

    def pools(self) -> list[PoolInfo]:
        self._some_member_serves()
        names = {info.name for m in self.members.values() if m.serving for info in m.backend.pools()}
        return [pool for pool in map(self.pool, sorted(names)) if pool is not None]

    def _some_member_serves(self) -> None:
        """NoMemberServes when none does: a pool is then unreachable (503), not unknown (404)."""
        if not any(m.serving for m in self.members.values()):
            raise NoMemberServes("no member cluster of the fleet is reachable now: retry shortly")

    def sandboxes(self, pool: str | None = None) -> list[SandboxPod]:
        """Those of the members that serve: a lost member's are neither listed, counted nor released."""
        return [s for s in self.index.in_pool(pool) if self._serves(s)]

    def leased_with_key(self, holder: str, idempotency_key: str) -> list[SandboxPod]:
        return [s for s in self.index.lease_keys.find(holder, idempotency_key) if self._serves(s)]

    def _serves(self, sandbox: SandboxPod) -> bool:
        """Whether `sandbox` is on a member that serves, and not under a lease lost with it."""
        member = self.members.get(sandbox.cluster)
        if member is None or member.lost:
            return False
        return not member.ended or sandbox.lease is None or sandbox.lease.id not in member.ended

    def sandbox(self, lease_id: str) -> SandboxPod | None:
        found = self.index.get(sandbox_key(lease_id))
        member = self.members.get(found.cluster) if found is not None else None
        if member is None or member.lost or lease_id in member.ended:
            return None  # fresh() says why
        return found

    async def fresh(self, lease_id: str) -> SandboxPod | None:
        cluster, _ = lease_cluster(lease_id)
        member = self.members.get(cluster)
        if member is None or not member.started:
            return None
        if lease_id in member.ended:
            raise self._lost(lease_id, member)()
        return await self._unless_lost(member, member.backend.fresh(lease_id), self._lost(lease_id, member))

    async def refresh_keyed(self, holder: str, idempotency_key: str, pool: str) -> None:
        """Each serving member's ledgers read for the key; one that is lost meanwhile is skipped.

        A partitioned member never answers: its read ends when the member is lost (within
        LOST_AFTER_SECONDS and a probe), as a claim on it does. Whatever it held under the key was
        lost with it (its holder hears 410, and it is released when the member is back).
        """
        serving = [m for m in self.members.values() if m.serving]

        def lost() -> MemberLost:
            return MemberLost("lost while its ledgers were read")  # never reaches a caller

        reads = (
            self._unless_lost(m, m.backend.refresh_keyed(holder, idempotency_key, pool), lost)
            for m in serving
        )
        results = await asyncio.gather(*reads, return_exceptions=True)
        for member, result in zip(serving, results, strict=True):
            # A member lost or down holds no lease this retry could use; one that answers, does.
            if isinstance(result, MemberLost) or not isinstance(result, Exception):
                continue
            if member.serving and member.backend.connected:
                raise result

    # -- Backend: writes (to the member that holds the sandbox) ------------------------------

    async def claim(self, sandbox: SandboxPod, lease: LeaseRecord) -> SandboxPod | None:
        """Claim it in its member; a member that cannot take the write is withdrawn, the waiter goes on."""
        member = self.members.get(sandbox.cluster)
        if member is None or member.lost:
            raise SandboxWithdrawn(f"sandbox {sandbox.key!r} is on no member cluster that serves")

        def lost() -> SandboxWithdrawn:
            member.ended.add(lease.id)  # should the write land after all, it is released on return
            return SandboxWithdrawn(f"member cluster {member.name!r} was lost during the claim")

        try:
            return await self._unless_lost(member, member.backend.claim(sandbox, lease), lost)
        except SandboxWithdrawn:
            raise
        except Exception as error:
            if isinstance(error, KubeError) and error.status < 500:
                raise  # its apiserver answered: that answer stands
            log.warning("member cluster %s failed a claim (%s): withdrawn for now", member.name, error)
            self._set_health(member, withdraw(member.health, self.clock()))
            raise SandboxWithdrawn(f"member cluster {member.name!r} is away") from error

    async def write_lease(self, sandbox: SandboxPod, lease: LeaseRecord) -> SandboxPod | None:
        member = self._member_of(sandbox)
        written = member.backend.write_lease(sandbox, lease)
        return await self._unless_lost(member, written, self._lost(lease.id, member))

    async def unclaim(self, sandbox: SandboxPod) -> None:
        member = self._member_of(sandbox)
        lost = self._lost(sandbox.lease.id if sandbox.lease else sandbox.key, member, end=True)
        with contextlib.suppress(MemberLost):  # its ledger keeps the claim: released on its return
            await self._unless_lost(member, member.backend.unclaim(sandbox), lost)

    async def release(self, sandbox: SandboxPod) -> None:
        member = self._member_of(sandbox)
        lease_id = sandbox.lease.id if sandbox.lease is not None else sandbox.key
        await self._unless_lost(
            member, member.backend.release(sandbox), self._lost(lease_id, member, end=True)
        )

    async def prefetch(self, pool: str, image: str, count: int, ttl_seconds: int) -> str:
        """Split evenly over the serving members: any of them may serve the leases that follow."""
        self._some_member_serves()
        serving = [m.backend for m in self.members.values() if m.serving]
        shares = [(b, n) for b, n in zip(serving, split_count(count, len(serving)), strict=True) if n]
        names = await asyncio.gather(*(b.prefetch(pool, image, n, ttl_seconds) for b, n in shares))
        return names[0]

    # -- reviews: the home member's apiserver authenticates and authorizes callers ------------

    async def review_token(self, token: str) -> tuple[str, list[str]] | None:
        return await self.home.review_token(token)

    async def may_use_pool(self, user: str, groups: list[str], pool: str) -> bool:
        return await self.home.may_use_pool(user, groups, pool)
