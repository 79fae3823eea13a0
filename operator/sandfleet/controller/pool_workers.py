"""The running operator: pool workers that plan (pure) and apply (via kube.py) while this replica leads."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sandfleet.controller import metrics
from sandfleet.controller.cache import ClusterCache
from sandfleet.controller.kube import Kube, KubeError
from sandfleet.controller.leader import LeaderElector
from sandfleet.controller.settings import OperatorSettings
from sandfleet.core import api
from sandfleet.core.autoscale import AutoscaleState, desired_replicas
from sandfleet.core.fleet import share_of
from sandfleet.core.ledger import Retire, shard_for
from sandfleet.core.model import (
    PoolSpec,
    Prewarm,
    SandboxPod,
    image_key,
    object_key,
    pool_from_object,
    prewarm_from_object,
)
from sandfleet.core.placement import region_capacity
from sandfleet.core.planner import (
    FAILURE_REASONS,
    NODE_NOT_READY,
    Create,
    Delete,
    FailureState,
    PoolPlan,
    WarmGroup,
    plan_pool,
)
from sandfleet.core.pods import AgentBundleImage, pool_selector, runtime_class_refusal, sandbox_pod
from sandfleet.core.status import (
    CAPACITY_LIMITED,
    DEGRADED,
    conditions,
    merge_conditions,
    pool_status,
    refused_conditions,
)
from sandfleet.kube.ledger import LedgerBook, LedgerUnavailable

log = logging.getLogger(__name__)

COMPONENT = "sandfleet-operator"
LEADER_LEASE = COMPONENT  # the coordination Lease the replicas contend for
MAX_CONCURRENT_WRITES = 64
TICK_SECONDS = 2.0  # re-plan this often even without events: leases expire and backoffs end on time
DEBOUNCE_SECONDS = 0.05  # gather a burst of Pod events into one pass
STATUS_INTERVAL_SECONDS = 1.0  # at most one status write per pool per interval while it fills
EXPECTATION_SECONDS = 60.0  # a write not seen in the watch by then is presumed lost
MAX_CREATES_PER_PASS = 500
EVENT_CONDITIONS = frozenset({DEGRADED, CAPACITY_LIMITED})
REJECTED_STATUSES = frozenset({400, 403, 422})
CREATE_ERROR_EVENT_SECONDS = 60.0


@dataclass
class PoolWorker:
    """One pool's memory between passes: what it just wrote, its failure streak and autoscale state."""

    spec: PoolSpec
    body: dict[str, Any]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    failures: FailureState = field(default_factory=FailureState)
    autoscale: AutoscaleState = field(default_factory=AutoscaleState)
    expected_creates: dict[str, SandboxPod] = field(default_factory=dict)
    expected_deletes: dict[str, float] = field(default_factory=dict)
    last_status: dict[str, Any] | None = None
    last_status_at: float = 0.0
    last_create_error_event_at: float = 0.0
    task: asyncio.Task[None] | None = None


class Operator:
    """All pools this operator keeps, the cluster cache that feeds them and the leader lease."""

    def __init__(
        self, kube: Kube, identity: str, settings: OperatorSettings, agent_key: bytes | None = None
    ) -> None:
        self.kube = kube
        self.identity = identity  # this replica's name in the leader election
        self.settings = settings
        self.agent_key = agent_key  # the fleet key every sandbox's agent token derives from
        self.workers: dict[str, PoolWorker] = {}
        self.prewarms: dict[str, Prewarm] = {}
        # Every namespace's lease ledgers: the lease state of ledger Pods, and where retirements go.
        self.ledgers = LedgerBook(kube, settings.namespaces, self._ledger_changed)
        self.cache = ClusterCache(
            on_pool_change=self._pool_changed,
            on_started=self._sandbox_started,
            on_leased=self._sandbox_leased,
            entry_of=self.ledgers.entry,
            on_ledger_pod_gone=self.ledgers.pod_gone,
        )
        self.elector = LeaderElector(
            kube,
            settings.leader_lease_namespace,
            LEADER_LEASE,
            identity,
            settings.leader_lease_seconds,
            renew_seconds=max(1.0, settings.leader_lease_seconds / 3),
        )
        self._writes = asyncio.Semaphore(MAX_CONCURRENT_WRITES)
        self._tasks: list[asyncio.Task[None]] = []

    # -- life cycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        spawn = asyncio.get_running_loop().create_task
        # Every Pod in the cluster, not only sandboxes: capacity is what all of them request. Every
        # replica watches, so a standby takes over with a warm cache.
        self._tasks.append(
            spawn(self.kube.list_and_watch("/api/v1/pods", self.cache.on_pod_event, self.cache.pods_listed))
        )
        self._tasks.append(
            spawn(
                self.kube.list_and_watch("/api/v1/nodes", self.cache.on_node_event, self.cache.nodes_listed)
            )
        )
        await self.ledgers.start()
        self._tasks.append(spawn(self.elector.run()))
        self._tasks.append(spawn(self._follow_leadership()))

    async def stop(self) -> None:
        for worker in self.workers.values():
            if worker.task:
                worker.task.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(
            *[w.task for w in self.workers.values() if w.task], *self._tasks, return_exceptions=True
        )
        await self.ledgers.stop()
        await self.elector.release()

    async def _follow_leadership(self) -> None:
        while True:
            await self.elector.changed.wait()
            self.elector.changed.clear()
            for worker in self.workers.values():
                # Whatever was written while another replica led, the status must be rewritten by us.
                worker.last_status = None
                worker.wake.set()

    # -- pools and pre-warms (from the kopf handlers) -------------------------------------------------

    def upsert_pool(self, body: Mapping[str, Any]) -> None:
        spec = pool_from_object(body)
        worker = self.workers.get(spec.key)
        if worker is None:
            worker = PoolWorker(spec=spec, body=dict(body))
            self.workers[spec.key] = worker
            worker.task = asyncio.get_running_loop().create_task(self._run_pool(worker))
        else:
            worker.spec, worker.body = spec, dict(body)
        worker.wake.set()

    def remove_pool(self, namespace: str, name: str) -> None:
        worker = self.workers.pop(object_key(namespace, name), None)
        if worker and worker.task:
            worker.task.cancel()
        for region in worker.spec.regions if worker else ():
            for state in metrics.STATES:
                with contextlib.suppress(KeyError):
                    metrics.SANDBOXES.remove(name, region.name, state)
            for gauge in (metrics.WARM_TARGET, metrics.REGION_CAPACITY):
                with contextlib.suppress(KeyError):
                    gauge.remove(name, region.name)

    def upsert_prewarm(self, body: Mapping[str, Any]) -> None:
        prewarm = prewarm_from_object(body, time.time())
        self.prewarms[object_key(prewarm.namespace, prewarm.name)] = prewarm
        self._pool_changed(object_key(prewarm.namespace, prewarm.pool))

    def remove_prewarm(self, namespace: str, name: str) -> None:
        prewarm = self.prewarms.pop(object_key(namespace, name), None)
        if prewarm:
            self._pool_changed(object_key(namespace, prewarm.pool))

    # -- cache callbacks ------------------------------------------------------------------------------

    def _pool_changed(self, pool_key: str) -> None:
        worker = self.workers.get(pool_key)
        if worker is not None:
            worker.wake.set()

    def _ledger_changed(self, namespace: str, shard: str, pods: set[str] | None) -> None:
        self.cache.on_ledger_change(namespace, shard, pods)

    def _sandbox_started(self, pool_key: str, sandbox: SandboxPod, phases: dict[str, float]) -> None:
        pool = pool_key.partition("/")[2]
        for phase, seconds in phases.items():
            metrics.STARTUP_SECONDS.labels(pool, sandbox.region, phase).observe(seconds)

    def _sandbox_leased(self, pool_key: str) -> None:
        metrics.LEASES_OBSERVED.labels(pool_key.partition("/")[2]).inc()

    # -- the pool loop --------------------------------------------------------------------------------

    async def _run_pool(self, worker: PoolWorker) -> None:
        retry_at: float | None = None
        last_pass_seconds = 0.0
        while True:
            timeout = TICK_SECONDS
            if retry_at is not None:
                timeout = max(0.05, min(timeout, retry_at - time.time()))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(worker.wake.wait(), timeout)
            # Gather a burst of events into one pass; a pass that took long waits as long again, so a
            # huge pool never spends more than about half the CPU re-planning while Pods stream in.
            await asyncio.sleep(max(DEBOUNCE_SECONDS, last_pass_seconds))
            worker.wake.clear()
            if not (self.elector.is_leader and self.cache.synced and self.ledgers.synced.is_set()):
                continue
            started = time.perf_counter()
            try:
                retry_at = await self.reconcile(worker)
                metrics.RECONCILES.labels("ok").inc()
            except asyncio.CancelledError:
                raise
            except Exception:
                metrics.RECONCILES.labels("error").inc()
                log.exception("reconciling %s failed; retrying", worker.spec.key)
                retry_at = time.time() + 1.0
            finally:
                last_pass_seconds = time.perf_counter() - started
                metrics.RECONCILE_SECONDS.observe(last_pass_seconds)

    def _groups(self, worker: PoolWorker, now: float) -> list[WarmGroup]:
        spec = worker.spec
        # A fleet member keeps its share of the fleet's warm target; an autoscaled pool follows the
        # leases routed to this member instead.
        target = share_of(spec.replicas, spec.fleet_share)
        if spec.autoscaling.enabled:
            target, worker.autoscale = desired_replicas(
                spec.autoscaling,
                self.cache.recent_leases(spec.key, now),
                self.cache.spinup_seconds(spec.key),
                worker.autoscale,
                now,
            )
        groups = [WarmGroup(spec.template, target)]
        wanted: dict[str, int] = {}
        for prewarm in self.prewarms.values():
            if prewarm.namespace == spec.namespace and prewarm.pool == spec.name and prewarm.expires_at > now:
                wanted[prewarm.image] = wanted.get(prewarm.image, 0) + prewarm.count
        for image, count in sorted(wanted.items()):
            if image != spec.template.image:
                groups.append(WarmGroup(spec.template.with_image(image), count, prewarm=True))
        return groups

    def _observed(self, worker: PoolWorker, now: float) -> list[SandboxPod]:
        """What the watch shows, corrected by our own writes it has not shown yet (expectations)."""
        seen = {s.name: s for s in self.cache.pool_sandboxes(worker.spec.key)}
        for name, sandbox in list(worker.expected_creates.items()):
            if name in seen or sandbox.created_at < now - EXPECTATION_SECONDS:
                del worker.expected_creates[name]
        for name, at in list(worker.expected_deletes.items()):
            gone = name not in seen or seen[name].terminating
            if gone or at < now - EXPECTATION_SECONDS:
                del worker.expected_deletes[name]
        view = [s for name, s in seen.items() if name not in worker.expected_deletes]
        return [*view, *worker.expected_creates.values()]

    async def reconcile(self, worker: PoolWorker) -> float | None:
        now = time.time()
        spec = worker.spec
        refusal = runtime_class_refusal(spec.template, self.settings.runtime_classes)
        if refusal is not None:
            await self._refuse(worker, refusal, now)
            return None
        groups = self._groups(worker, now)
        sandboxes = self._observed(worker, now)
        unscheduled: dict[str, int] = {}
        for sandbox in sandboxes:
            if sandbox.node is None and not sandbox.terminating:
                unscheduled[sandbox.region] = unscheduled.get(sandbox.region, 0) + 1
        capacity = region_capacity(
            self.cache.nodes.values(), self.cache.usage, spec.template, spec.regions, unscheduled
        )
        nodes_ready = {name: node.ready for name, node in self.cache.nodes.items()}
        for sandbox in sandboxes:
            if sandbox.node is not None and sandbox.node not in self.cache.nodes:
                # Its Node was deleted (the machine is gone): as dead as a NotReady one, so its free
                # sandboxes are replaced now, not when the pod GC gets to them (40 s or more).
                nodes_ready[sandbox.node] = False
        decided = plan_pool(spec, groups, sandboxes, capacity, nodes_ready, worker.failures, now)
        # Already on their way out when their Node went: no kubelet is left to confirm, so force it.
        stranded = [
            Delete(s.name, NODE_NOT_READY, force=True)
            for s in sandboxes
            if s.terminating and s.node is not None and s.node not in self.cache.nodes
        ]
        worker.failures = decided.failures
        if decided.creates or decided.deletes:
            log.info(
                "%s: creating %d, deleting %d; targets %s",
                spec.key,
                min(len(decided.creates), MAX_CREATES_PER_PASS),
                len(decided.deletes),
                {r.name: r.target for r in decided.regions},
            )
        templates = {g.key: g for g in groups}
        decided_on = {s.name: s for s in sandboxes}
        creates = decided.creates[:MAX_CREATES_PER_PASS]
        deletes = (*decided.deletes, *stranded)
        refusals, _ = await asyncio.gather(
            asyncio.gather(*(self._create(worker, c, templates[c.template_hash], now) for c in creates)),
            asyncio.gather(*(self._delete(worker, d, decided_on.get(d.name)) for d in deletes)),
        )
        rejected = [refusal for refusal in refusals if refusal is not None]
        if rejected:
            # One failure per pass, however many creates it tried: the same refusal (a missing
            # ServiceAccount, a quota) repeated 500 times is one reason, and counted 500 times it
            # put a new namespace's pool straight into the longest backoff (5 minutes).
            worker.failures = worker.failures.record(1, time.time(), rejected[0])
            if time.time() - worker.last_create_error_event_at > CREATE_ERROR_EVENT_SECONDS:
                worker.last_create_error_event_at = time.time()
                await self._event(worker, "Warning", "CreateFailed", rejected[0])
        if len(decided.creates) > MAX_CREATES_PER_PASS:
            worker.wake.set()
        publish_at = await self._publish(worker, decided, now)
        wakes = [t for t in (decided.retry_at, publish_at) if t is not None]
        return min(wakes) if wakes else None

    async def _create(self, worker: PoolWorker, create: Create, group: WarmGroup, now: float) -> str | None:
        """Create one sandbox Pod; the apiserver's refusal if it rejected the Pod (not a transient error)."""
        spec = worker.spec
        name = f"{spec.name[:40]}-{secrets.token_hex(4)}"
        shard = None
        if spec.lease.store == api.STORE_LEDGER:
            size = max(spec.replicas, spec.autoscaling.max_replicas if spec.autoscaling.enabled else 0)
            shard = shard_for(name, spec.name, size, self.settings.ledger_shards)
        sandbox = SandboxPod(
            namespace=spec.namespace,
            name=name,
            pool=spec.name,
            region=create.region,
            zone=create.zone,
            template_hash=create.template_hash,
            state=api.LEASE_FREE,
            created_at=now,
            prewarm=create.prewarm,
            image_key=image_key(group.template.image),
            shard=shard,
        )
        manifest = sandbox_pod(
            spec,
            group.template,
            name=name,
            region=create.region,
            zone=create.zone,
            prewarm=create.prewarm,
            agent_key=self.agent_key,
            shard=shard,
            agent_bundle=AgentBundleImage(
                self.settings.agent_bundle_image, self.settings.agent_bundle_pull_policy
            ),
        )
        # Counted as starting before the request leaves, so no later pass can create it twice.
        worker.expected_creates[name] = sandbox
        async with self._writes:
            try:
                await self.kube.create_pod(spec.namespace, manifest)
                metrics.POD_OPERATIONS.labels("create", "warm", "ok").inc()
            except (TimeoutError, KubeError, OSError) as error:
                worker.expected_creates.pop(name, None)
                metrics.POD_OPERATIONS.labels("create", "warm", "error").inc()
                log.warning("creating a sandbox for %s failed: %s", spec.key, error)
                if isinstance(error, KubeError) and error.status in REJECTED_STATUSES:
                    # Rejected (invalid template, quota, admission): retrying at once would only storm.
                    return str(error)
        return None

    async def _delete(self, worker: PoolWorker, delete: Delete, decided_on: SandboxPod | None) -> None:
        worker.expected_deletes[delete.name] = time.time()
        node = getattr(self.cache.sandboxes.get(worker.spec.key, {}).get(delete.name), "node", None)
        # On a deleted Node no kubelet is left to finish a graceful deletion: only force ends it.
        force = delete.force or (node is not None and node not in self.cache.nodes)
        # Conditional on the version it was decided on (see Kube.delete_pod): a Pod's own, or, for
        # a ledger Pod, a retirement in its ledger first (a lease there does not change the Pod).
        version = decided_on.resource_version if decided_on is not None else ""
        if decided_on is not None and decided_on.shard is not None and not decided_on.terminating:
            if not await self._retire(worker, delete, decided_on):
                return
            version = ""
        async with self._writes:
            try:
                deleted = await self.kube.delete_pod(
                    worker.spec.namespace, delete.name, force=force, resource_version=version
                )
                if not deleted:
                    # Changed since we decided (a gateway leased it, most often): the watch brings
                    # the change, and the next pass decides again on it.
                    worker.expected_deletes.pop(delete.name, None)
                    metrics.POD_OPERATIONS.labels("delete", delete.reason, "conflict").inc()
                    return
                metrics.POD_OPERATIONS.labels("delete", delete.reason, "ok").inc()
            except (TimeoutError, KubeError, OSError) as error:
                worker.expected_deletes.pop(delete.name, None)
                metrics.POD_OPERATIONS.labels("delete", delete.reason, "error").inc()
                log.warning("deleting sandbox %s/%s failed: %s", worker.spec.namespace, delete.name, error)
        if delete.reason in FAILURE_REASONS:
            log.info("replaced sandbox %s/%s: %s", worker.spec.namespace, delete.name, delete.reason)

    async def _retire(self, worker: PoolWorker, delete: Delete, sandbox: SandboxPod) -> bool:
        """Mark a ledger Pod retired (nobody may lease it) before deleting it; False: leave it be.

        Released and retired Pods are past leasing already. Any other is retired only if its entry
        is still the one the delete was decided on: a gateway that leased or renewed it meanwhile
        wins, and the next pass decides again. Retirements on one shard share a ledger write.
        """
        if sandbox.state in (api.LEASE_RELEASED, api.LEASE_RETIRED) or sandbox.shard is None:
            return True
        try:
            retired = await self.ledgers.submit(
                sandbox.namespace, sandbox.shard, Retire(sandbox.name, sandbox.entry_rev)
            )
        except LedgerUnavailable as error:
            log.warning("retiring sandbox %s/%s failed: %s", sandbox.namespace, sandbox.name, error)
            retired = None
        if retired is None:
            worker.expected_deletes.pop(delete.name, None)
            metrics.POD_OPERATIONS.labels("delete", delete.reason, "conflict").inc()
            return False
        return True

    async def _publish(self, worker: PoolWorker, decided: PoolPlan, now: float) -> float | None:
        """Metrics and status; returns when to come back for a status write held back to batch a burst."""
        spec = worker.spec
        for region in decided.regions:
            counts = {
                "warm": region.ready,
                "starting": region.starting,
                "leased": region.leased,
                "failed": region.failed,
            }
            for state, value in counts.items():
                metrics.SANDBOXES.labels(spec.name, region.name, state).set(value)
            metrics.WARM_TARGET.labels(spec.name, region.name).set(region.target)
            metrics.REGION_CAPACITY.labels(spec.name, region.name).set(region.capacity)
        previous = (worker.last_status or worker.body.get("status") or {}).get("conditions") or []
        merged, transitions = merge_conditions(previous, conditions(spec, decided, now), now)
        status = pool_status(spec, decided, merged)
        if status == worker.last_status:
            return None
        if not transitions and now - worker.last_status_at < STATUS_INTERVAL_SECONDS:
            return worker.last_status_at + STATUS_INTERVAL_SECONDS
        await self.kube.patch_pool_status(spec.namespace, spec.name, status)
        worker.last_status, worker.last_status_at = status, now
        for change in transitions:
            if change.type in EVENT_CONDITIONS:
                kind = "Warning" if change.status == "True" else "Normal"
                reason = change.reason if change.status == "True" else f"{change.type}Cleared"
                await self._event(worker, kind, reason, change.message)
        return None

    async def _refuse(self, worker: PoolWorker, reason: str, now: float) -> None:
        """A pool the operator will not fill: say why in its status and one Event; create nothing."""
        spec = worker.spec
        previous = (worker.last_status or worker.body.get("status") or {}).get("conditions") or []
        merged, transitions = merge_conditions(previous, refused_conditions(spec, reason), now)
        status = {
            "observedGeneration": spec.generation,
            "selector": pool_selector(spec.name),
            "conditions": merged,
        }
        if status == worker.last_status:
            return
        await self.kube.patch_pool_status(spec.namespace, spec.name, status)
        worker.last_status, worker.last_status_at = status, now
        if any(change.type == DEGRADED and change.status == "True" for change in transitions):
            log.warning("refusing pool %s: %s", spec.key, reason)
            await self._event(worker, "Warning", "RuntimeClassNotAllowed", reason)

    async def _event(self, worker: PoolWorker, kind: str, reason: str, message: str) -> None:
        meta = worker.body.get("metadata", {})
        involved = {
            "namespace": worker.spec.namespace,
            "name": worker.spec.name,
            "uid": str(meta.get("uid", "")),
        }
        await self.kube.post_event(involved, kind, reason, message, COMPONENT)
