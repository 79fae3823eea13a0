"""The gateway's Kubernetes side: informers that feed the index, conditional writes, reviews."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from sandfleet.core import api, model
from sandfleet.core.leases import (
    LeaseRecord,
    lease_key_label,
    lease_metadata,
    release_metadata,
    reserve_metadata,
    unclaim_metadata,
)
from sandfleet.core.ledger import Claim, LedgerEntry, Op, Release, Reserve, Rewrite, Unclaim, overlay
from sandfleet.core.model import SandboxPod, image_key, lease_cluster, lease_id, split_lease_id
from sandfleet.core.partition import owner, shard_owner
from sandfleet.core.pods import sandbox_from_pod
from sandfleet.core.recycle import recycle_decision
from sandfleet.core.timestamps import format_time
from sandfleet.gateway.backend import IndexedReads, PoolInfo, SandboxIndex
from sandfleet.gateway.kube_members import GatewayMembers
from sandfleet.gateway.recycling import AgentResets
from sandfleet.kube.api_calls import APPLY_PATCH, MERGE_PATCH, KubeClient
from sandfleet.kube.config import ApiClient, Configuration, api_client, load_configuration
from sandfleet.kube.errors import KubeError
from sandfleet.kube.informer import Informer
from sandfleet.kube.keyed_feed import KeyedFeed, as_is
from sandfleet.kube.ledger import LedgerBook, LedgerUnavailable

log = logging.getLogger(__name__)

# Every concurrent claim is a request; the default pool of 4 connections would queue them.
POOL_SIZE = 64


async def connect(configuration: Configuration | None = None) -> ApiClient:
    """An API client on `configuration`, else on the kubeconfig or in-cluster identity (KubeConfigError)."""
    return api_client(configuration or await load_configuration(), POOL_SIZE)


def pool_from_object(obj: dict[str, Any]) -> PoolInfo:
    pool = model.pool_from_object(obj)
    return PoolInfo(
        namespace=pool.namespace,
        name=pool.name,
        default_ttl_seconds=pool.lease.default_ttl_seconds,
        max_ttl_seconds=pool.lease.max_ttl_seconds,
        regions=tuple(r.name for r in pool.regions),
        image=pool.template.image,
        max_sandboxes=pool.max_sandboxes,
        recycle=pool.recycle,
        store=pool.lease.store,
        fleet_share=pool.fleet_share,
        replicas=pool.replicas,
        room=pool_room(obj.get("status") or {}, pool.max_sandboxes),
        clean_scoring=pool.template.commands_user is not None,
        commands_as_image_user=pool.template.commands_user is not None,
    )


def pool_room(status: Mapping[str, Any], max_sandboxes: int) -> int | None:
    """How many warm sandboxes of the pool this cluster can hold now, from its operator's status.

    Its warm ones on nodes plus its regions' free slots. Leased sandboxes are not counted (a warm
    target is on top of them; their nodes' slots are already taken), nor Pods no node has taken:
    a member short of nodes would otherwise keep its share by creating Pods that wait. None while
    the operator has written no per-region capacity yet.
    """
    regions = status.get("regions") or []
    if not regions or any("capacity" not in r for r in regions):
        return None
    placed = sum(int(r.get("ready") or 0) + int(r.get("starting") or 0) - int(r.get("unscheduled") or 0)
                 for r in regions)  # fmt: skip
    leased = sum(int(r.get("leased") or 0) for r in regions)
    free = sum(max(int(r["capacity"]), 0) for r in regions)
    return max(0, min(max_sandboxes - leased, placed + free))


class KubeBackend(IndexedReads):
    """A Backend over the Kubernetes API: pools and sandbox Pods in one namespace.

    A Pod's lease is read from, and written to, where its Pod says: the shard's ledger for a Pod
    with a shard label (batched, `sandfleet.kube.ledger`), else the Pod itself (one conditional
    patch per write). The index holds each Pod as its ledger entry shows it (`core.ledger.overlay`).
    """

    def __init__(
        self,
        namespace: str,
        connect: Callable[[], Awaitable[ApiClient]] = connect,
        token_audiences: list[str] | None = None,
        replica: str | None = None,
        resets: AgentResets | None = None,
        cluster: str = "",
        index: SandboxIndex | None = None,
    ) -> None:
        self.namespace = namespace
        # The fleet member this cluster is, when one gateway serves several (gateway.fleet): its
        # sandboxes' lease ids name it, and they share the fleet's index with the other members'.
        self.cluster = cluster
        self._shared_index = index is not None
        # Resets released sandboxes of recycling pools through their agents; None deletes them all.
        self.resets = resets
        # This replica's name among the gateway replicas: each hands out its own share of the warm
        # Pods first (gateway.kube_members); None hands out oldest first, racing the others.
        self.replica = replica
        self.members: GatewayMembers | None = None
        # A token minted for the gateway's own audience is useless against the apiserver itself.
        self.token_audiences = token_audiences or None
        self._connect = connect
        self.index = index if index is not None else SandboxIndex()
        # Each Pod as the Pod itself reads (before its ledger entry is laid over it).
        self._pods: dict[str, SandboxPod] = {}
        # Per pool, its Pods of the `pod` store (their leases are written on them, not in a ledger).
        self._own_leases: Counter[str] = Counter()
        self.ledgers: LedgerBook | None = None
        self._pools: dict[str, PoolInfo] = {}
        self._informers: list[Informer] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.synced = asyncio.Event()
        self._pods_synced = asyncio.Event()
        self._pools_synced = asyncio.Event()
        # The informers' handlers, through feeds that take a relist whole when it ends, so readers
        # never see half of one.
        pods = KeyedFeed(
            self._read,
            _sandbox_key,
            self._watched_pod,
            self._pod_deleted,
            lambda: self._pods,
            self._pods_synced.set,
            replace=self._pods_relisted,
        )
        self._on_pod, self._pods_listed = pods.on_event, pods.on_synced
        pools = KeyedFeed(
            as_is,
            _object_name,
            self._watched_pool,
            self._pool_deleted,
            lambda: self._pools,
            self._pools_synced.set,
            replace=self._pools_relisted,
        )
        self._on_pool, self._pools_listed = pools.on_event, pools.on_synced

    @property
    def connected(self) -> bool:
        """Whether every watch is up (a broken one keeps serving what it knew)."""
        ledgers = self.ledgers is None or self.ledgers.connected
        return ledgers and all(informer.connected for informer in self._informers)

    # -- Backend: reads come from the watch-fed index, never from a list on the hot path --------

    def pool(self, name: str) -> PoolInfo | None:
        return self._pools.get(name)

    def pools(self) -> list[PoolInfo]:
        return sorted(self._pools.values(), key=lambda p: p.name)

    # -- Backend: conditional writes -----------------------------------------------------------

    async def claim(self, sandbox: SandboxPod, lease: LeaseRecord) -> SandboxPod | None:
        if sandbox.shard is not None:
            return await self._submit(sandbox, Claim(sandbox.name, sandbox.entry_rev, lease))
        return await self._patch(sandbox, lease_metadata(lease))

    async def write_lease(self, sandbox: SandboxPod, lease: LeaseRecord) -> SandboxPod | None:
        if sandbox.shard is not None:
            return await self._submit(sandbox, Rewrite(sandbox.name, sandbox.entry_rev, lease))
        return await self._patch(sandbox, lease_metadata(lease))

    async def unclaim(self, sandbox: SandboxPod) -> None:
        # Conditional on the claim's own version: if anybody wrote since (a retry of the same
        # request adopted the lease through another replica), the lease is theirs and stays.
        if sandbox.shard is not None:
            with contextlib.suppress(LedgerUnavailable):
                await self._submit(sandbox, Unclaim(sandbox.name, sandbox.entry_rev))
            return
        lease = sandbox.lease
        if sandbox.episodes and lease is not None and lease.run:
            # A recycled sandbox nobody received goes back to its run, never to warm for anyone.
            back = reserve_metadata(lease.holder, lease.run, sandbox.episodes, time.time())
        else:
            back = unclaim_metadata()
        with contextlib.suppress(KubeError):
            await self._patch(sandbox, back)

    async def release(self, sandbox: SandboxPod) -> None:
        if await self._recycled(sandbox):
            return
        if sandbox.shard is not None and sandbox.lease is not None:
            # Whatever renewed it since: a release names the lease, not the entry's revision. A
            # failed write is the caller's to hear (503): it retries, and a release is idempotent.
            await self._submit(sandbox, Release(sandbox.name, sandbox.lease.id))
            return
        # Unconditional: releasing twice, or after a renewal elsewhere, must still release.
        with contextlib.suppress(KubeError):
            await self._patch(sandbox, release_metadata(), conditional=False)

    async def _recycled(self, sandbox: SandboxPod) -> bool:
        """Reset a recycling pool's sandbox and keep it for its run's next lease; False: delete it."""
        pool, lease = self._pools.get(sandbox.pool), sandbox.lease
        if self.resets is None or pool is None or lease is None or not lease.run:
            return False
        episodes = sandbox.episodes + 1
        decision = recycle_decision(
            pool.recycle, run=lease.run, episodes=episodes, born_at=sandbox.created_at, now=time.time()
        )
        if not decision.recycle:
            return False
        result = await self.resets.reset(sandbox, episodes)
        if result.already_reset:
            return True  # another replica released it first and resets it: its release stands
        if not result.clean:
            log.warning("sandbox %s is not recycled: %s", sandbox.name, "; ".join(result.problems))
            return False
        # Unconditional like a release: its agent is in the next episode already, so no call of
        # the ended one gets in, and nobody but this write makes it leasable for the run again.
        if sandbox.shard is not None:
            await self._submit(sandbox, Reserve(sandbox.name, lease.id, lease.holder, lease.run, episodes))
            return True
        with contextlib.suppress(KubeError):
            await self._patch(
                sandbox, reserve_metadata(lease.holder, lease.run, episodes, time.time()), conditional=False
            )
        return True

    async def _submit(self, sandbox: SandboxPod, op: Op) -> SandboxPod | None:
        """Queue `op` on the sandbox's ledger shard; the sandbox as the committed entry shows it."""
        assert self.ledgers is not None
        assert sandbox.shard is not None
        entry: LedgerEntry | None = await self.ledgers.submit(sandbox.namespace, sandbox.shard, op)
        if entry is None:
            return None
        # The commit put it in the index already (the ledger's change listener), unless another
        # write moved it on since: then this is the entry as this operation left it.
        known = self.index.get(sandbox.key)
        if known is not None and known.shard == sandbox.shard and known.entry_rev == entry.rev:
            return known
        return overlay(self._pods.get(sandbox.key, sandbox), entry)

    async def refresh_keyed(self, holder: str, idempotency_key: str, pool: str) -> None:
        # A consistent read (no resourceVersion): every write that committed before it, whichever
        # replica made it, is in its answer (the watch may not have delivered them yet).
        if self.ledgers is not None:
            await self.ledgers.refresh(self.namespace)
        info = self._pools.get(pool)
        if (info is None or info.store == api.STORE_LEDGER) and not self._own_leases.get(pool):
            return  # none of the pool's leases is written on a Pod: no list of Pods by label
        selector = f"{api.LEASE_KEY_LABEL}={lease_key_label(holder, idempotency_key)}"
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        listed = await self.kube.json("GET", path, query={"labelSelector": selector})
        for pod in listed.get("items") or ():
            found = self._read(pod)
            if found is not None:
                self._upsert(found)

    async def fresh(self, lease_id: str) -> SandboxPod | None:
        parts = split_lease_id(lease_id)
        if parts is None or parts[0] != self.namespace or lease_cluster(lease_id)[0] != self.cluster:
            return None
        try:
            pod = await self.kube.json("GET", f"/api/v1/namespaces/{parts[0]}/pods/{parts[1]}")
        except KubeError as error:
            if error.status == 404:
                return None
            raise
        found = self._read(pod)
        if found is None:
            return None
        if found.shard is not None and self.ledgers is not None:
            await self.ledgers.read(found.namespace, found.shard)
        self._upsert(found)
        return self.index.get(found.key)

    async def _patch(
        self, sandbox: SandboxPod, metadata: dict[str, Any], conditional: bool = True
    ) -> SandboxPod | None:
        body: dict[str, Any] = {"metadata": dict(metadata)}
        if conditional:
            # The precondition that makes a claim atomic: a stale resourceVersion is a 409.
            body["metadata"]["resourceVersion"] = sandbox.resource_version
        path = f"/api/v1/namespaces/{sandbox.namespace}/pods/{sandbox.name}"
        try:
            pod = await self.kube.json("PATCH", path, body=body, content_type=MERGE_PATCH)
        except KubeError as error:
            if error.status in (404, 409):
                return None
            raise
        updated = self._read(pod)
        if updated is not None:
            self._upsert(updated)
        return updated

    async def prefetch(self, pool: str, image: str, count: int, ttl_seconds: int) -> str:
        """Server-side apply a SandboxPrewarm; the operator warms the image for its TTL.

        `expiresAt` moves with every call, so prefetching the same image again extends it (a
        re-apply of identical content would not count as a write).
        """
        name = f"{pool}-{image_key(image)}"[:253]
        expires = format_time(time.time() + ttl_seconds)
        body = {
            "apiVersion": api.API_VERSION,
            "kind": api.PREWARM_KIND,
            "metadata": {"name": name, "labels": {api.POOL_LABEL: pool}},
            "spec": {
                "pool": pool,
                "image": image,
                "count": count,
                "ttlSeconds": ttl_seconds,
                "expiresAt": expires,
            },
        }
        path = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{self.namespace}/{api.PREWARM_PLURAL}/{name}"
        await self.kube.send(
            "PATCH",
            path,
            query={"fieldManager": "sandfleet-gateway", "force": True},
            body=body,
            content_type=APPLY_PATCH,
        )
        return name

    async def set_fleet_share(self, pool: str, share: float) -> None:
        """Give this member `share` of `pool`'s warm target (a fleet gateway's; its operator reads it)."""
        path = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{self.namespace}/{api.POOL_PLURAL}/{pool}"
        # Ten digits: the share is rounded in the ninth, and must read back as the same number.
        body = {"metadata": {"annotations": {api.FLEET_SHARE_ANNOTATION: f"{share:.10g}"}}}
        await self.kube.send("PATCH", path, body=body, content_type=MERGE_PATCH)

    # -- reviews for authentication and authorization -----------------------------------------

    async def review_token(self, token: str) -> tuple[str, list[str]] | None:
        """The user a bearer token belongs to, by TokenReview; None if the apiserver rejects it."""
        spec: dict[str, Any] = {"token": token}
        if self.token_audiences:
            spec["audiences"] = self.token_audiences
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        result = await self.kube.json("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body=review)
        status = result.get("status") or {}
        if not status.get("authenticated"):
            return None
        user = status.get("user") or {}
        return str(user.get("username") or ""), list(user.get("groups") or [])

    async def may_use_pool(self, user: str, groups: list[str], pool: str) -> bool:
        """Whether RBAC lets `user` use `pool` (verb "use" on sandboxpools), by SubjectAccessReview."""
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": groups,
                "resourceAttributes": {
                    "group": api.GROUP,
                    "resource": api.POOL_PLURAL,
                    "verb": "use",
                    "name": pool,
                    "namespace": self.namespace,
                },
            },
        }
        result = await self.kube.json(
            "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=review
        )
        return bool((result.get("status") or {}).get("allowed"))

    # -- the watches ---------------------------------------------------------------------------

    async def start(self, sync_timeout: float = 60.0) -> None:
        """Connect, list and start watching; returns once the index holds every sandbox."""
        self.kube = KubeClient(await self._connect())
        pods = f"/api/v1/namespaces/{self.namespace}/pods"
        pools = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{self.namespace}/{api.POOL_PLURAL}"
        self._informers = [
            Informer(
                self.kube, pods, self._on_pod, self._pods_listed, query={"labelSelector": api.POOL_LABEL}
            ),
            Informer(self.kube, pools, self._on_pool, self._pools_listed, resource=api.POOL_PLURAL),
        ]
        self.ledgers = LedgerBook(self.kube, (self.namespace,), self._on_ledger)
        await self.ledgers.start()
        self._tasks = [asyncio.create_task(informer.run()) for informer in self._informers]
        self._tasks.append(asyncio.create_task(self._mark_synced()))
        if self.replica is not None:
            self.members = GatewayMembers(self.kube, self.namespace, self.replica, self._share_with)
            await self.members.start()
        await asyncio.wait_for(self.synced.wait(), timeout=sync_timeout)

    def replicas(self) -> int:
        """The gateway replicas sharing this namespace's warm Pods as this one sees them (1: alone)."""
        return len(self.members.members) if self.members is not None else 1

    def _share_with(self, members: tuple[str, ...]) -> None:
        """The replicas changed: prefer the warm Pods that are ours among them (all, when alone).

        A ledger Pod belongs to whoever owns its shard, so a replica's claims go to the ledgers it
        writes anyway and two replicas rarely write the same one.
        """
        me = self.replica
        if me is None or len(members) < 2:
            self.index.shelves.prefer(None)
        else:
            self.index.shelves.prefer(lambda sandbox: first_owner(sandbox, members) == me)

    async def stop(self) -> None:
        if self.members is not None:
            await self.members.stop()
        if self.ledgers is not None:
            await self.ledgers.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.resets is not None:
            await self.resets.close()
        await self.kube.close()

    async def _mark_synced(self) -> None:
        await self._pods_synced.wait()
        await self._pools_synced.wait()
        if self.ledgers is not None:
            await self.ledgers.synced.wait()
        self.synced.set()

    def _watched_pod(self, key: str, sandbox: SandboxPod) -> None:
        self._upsert(sandbox)

    def _pod_deleted(self, key: str) -> None:
        known = self._pods.get(key)
        if known is not None:
            self._forget(known)

    def _pods_relisted(self, listed: dict[str, SandboxPod], gone: list[str]) -> None:
        """A relist is the truth: it replaces every reading, a write's newer answer included."""
        for key in gone:
            self._forget(self._pods[key])  # gone while nobody watched
        if self._shared_index:  # the other members' sandboxes stay
            for key in self._pods:
                self.index.pop(key, None)
        else:
            self.index.clear()
        self._pods.clear()
        self._own_leases.clear()
        for sandbox in listed.values():
            self._upsert(sandbox)

    def _read(self, pod: dict[str, Any]) -> SandboxPod | None:
        """A Pod as a sandbox of this cluster (None: not a sandbox)."""
        sandbox = sandbox_from_pod(pod)
        if sandbox is None or not self.cluster:
            return sandbox
        return dataclasses.replace(sandbox, cluster=self.cluster)

    def _upsert(self, sandbox: SandboxPod) -> None:
        """A reading of a Pod (a watch event, or a write's answer): into the index, with its ledger entry."""
        known = self._pods.get(sandbox.key)
        if known is not None and _newer(known.resource_version, sandbox.resource_version):
            return  # a late watch event must not roll back what a write already told us
        self._pods[sandbox.key] = sandbox
        if known is not None and known.shard is None:
            self._own_leases[known.pool] -= 1
        if sandbox.shard is None:
            self._own_leases[sandbox.pool] += 1
        self.index.put(self._as_leased(sandbox))

    def _forget(self, sandbox: SandboxPod) -> None:
        known = self._pods.pop(sandbox.key, None)
        if known is not None and known.shard is None:
            self._own_leases[known.pool] -= 1
        self.index.pop(sandbox.key, None)
        if sandbox.shard is not None and self.ledgers is not None:
            self.ledgers.pod_gone(sandbox.namespace, sandbox.shard, sandbox.name)

    def _as_leased(self, sandbox: SandboxPod) -> SandboxPod:
        """The Pod with the lease state its ledger entry gives it (a Pod-written lease: as it is)."""
        if sandbox.shard is None or self.ledgers is None:
            return sandbox
        return overlay(sandbox, self.ledgers.entry(sandbox.namespace, sandbox.shard, sandbox.name))

    def _on_ledger(self, namespace: str, shard: str, pods: set[str] | None) -> None:
        """Entries of a ledger changed (None: all of them): their Pods' readings change with them."""
        if pods is None:
            changed = [s for s in self._pods.values() if s.namespace == namespace and s.shard == shard]
        else:
            keys = (lease_id(namespace, n, cluster=self.cluster) for n in pods)
            changed = [s for s in map(self._pods.get, keys) if s is not None]
        for known in changed:
            if known.shard == shard:
                self.index.put(self._as_leased(known))

    def _watched_pool(self, name: str, obj: dict[str, Any]) -> None:
        self._pools[name] = pool_from_object(obj)

    def _pool_deleted(self, name: str) -> None:
        self._pools.pop(name, None)

    def _pools_relisted(self, listed: dict[str, dict[str, Any]], gone: list[str]) -> None:
        self._pools = {name: pool_from_object(obj) for name, obj in listed.items()}


def first_owner(sandbox: SandboxPod, members: tuple[str, ...]) -> str | None:
    """The replica a warm sandbox belongs to first: its ledger shard's owner, else its name's."""
    return owner(sandbox.name, members) if sandbox.shard is None else shard_owner(sandbox.shard, members)


def _sandbox_key(sandbox: SandboxPod) -> str:
    return sandbox.key


def _object_name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def _newer(known: str, incoming: str) -> bool:
    """Whether `known` is strictly newer (resourceVersions are etcd revisions, compared as ints)."""
    try:
        return int(known) > int(incoming)
    except ValueError:
        return False
