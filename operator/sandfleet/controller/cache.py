"""What the watches have shown: sandboxes per pool, node readiness and the capacity every Pod holds."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from statistics import median
from typing import Any

from sandfleet.core.ledger import LedgerEntry, overlay
from sandfleet.core.model import Node, SandboxPod, object_key
from sandfleet.core.pods import node_from_object, pod_usage, sandbox_from_pod, startup_phases
from sandfleet.core.resources import Resources
from sandfleet.kube.keyed_feed import KeyedFeed, as_is

log = logging.getLogger(__name__)

# A ledger Pod's entry in its shard's ledger (namespace, shard, pod), None when it has none (free).
EntryOf = Callable[[str, str, str], LedgerEntry | None]

RECENT_STARTUPS = 64
LEASE_HISTORY_SECONDS = 600.0


class ClusterCache:
    """Compact views of Pods and Nodes, fed by list+watch, with callbacks for what the pools care about.

    Capacity (node usage, node readiness) is read on each pool's next pass rather than pushed: every
    Pod event changes it, and waking every pool for each would be a storm.
    """

    def __init__(
        self,
        on_pool_change: Callable[[str], None],
        on_started: Callable[[str, SandboxPod, dict[str, float]], None] | None = None,
        on_leased: Callable[[str], None] | None = None,
        entry_of: EntryOf | None = None,
        on_ledger_pod_gone: Callable[[str, str, str], None] | None = None,
    ) -> None:
        self.sandboxes: dict[str, dict[str, SandboxPod]] = {}
        # Ledger Pods as the Pod itself reads, so a change of their ledger entry can be laid over them.
        self._ledger_pods: dict[str, SandboxPod] = {}
        self._entry_of = entry_of
        self._on_ledger_pod_gone = on_ledger_pod_gone
        self.nodes: dict[str, Node] = {}
        self.usage: dict[str, Resources] = {}
        self.pods_synced = asyncio.Event()
        self.nodes_synced = asyncio.Event()
        self.startups: dict[str, deque[float]] = {}
        self.lease_times: dict[str, deque[float]] = {}
        self._pod_usage: dict[str, tuple[str, Resources]] = {}
        self._pod_pool: dict[str, str] = {}
        self._on_pool_change = on_pool_change
        self._on_started = on_started
        self._on_leased = on_leased
        # The informers' handlers (`on_pod_event`, `pods_listed`; `on_node_event`, `nodes_listed`).
        # Every Pod's key counts as listed, ours or not; a Node that cannot be read is skipped.
        pods = KeyedFeed(
            as_is, _pod_key, self._upsert_pod, self._forget_pod, self._held_pods, self.pods_synced.set
        )
        self.on_pod_event = pods.on_event
        self.pods_listed = pods.on_synced  # drops whatever the (re)list did not show, then pods_synced
        nodes = KeyedFeed(
            _readable_node,
            _node_name,
            self._upsert_node,
            self._forget_node,
            lambda: self.nodes,
            self.nodes_synced.set,
        )
        self.on_node_event = nodes.on_event
        self.nodes_listed = nodes.on_synced

    # -- pods -----------------------------------------------------------------------------------------

    def _upsert_pod(self, key: str, pod: dict[str, Any]) -> None:
        try:
            usage = pod_usage(pod)
        except ValueError:  # someone else's Pod with a quantity we cannot read: it holds no capacity here
            log.warning("cannot read the resource requests of pod %s", key)
            usage = None
        self._set_usage(key, usage)
        sandbox = sandbox_from_pod(pod)
        if sandbox is None or not sandbox.managed:
            return
        if sandbox.shard is not None:
            self._ledger_pods[key] = sandbox
            sandbox = self._as_leased(sandbox)
        previous = self._put(key, sandbox)
        # Spin-up is measured once per sandbox, when it turns Ready under our eyes (not on a relist).
        if sandbox.ready and previous is not None and not previous.ready:
            phases = startup_phases(pod)
            if phases is not None:
                pool_key = self._pod_pool[key]
                self.startups.setdefault(pool_key, deque(maxlen=RECENT_STARTUPS)).append(phases["total"])
                if self._on_started:
                    self._on_started(pool_key, sandbox, phases)

    def on_ledger_change(self, namespace: str, shard: str, pods: set[str] | None) -> None:
        """Entries of a shard's ledger changed (None: all of them): so did those Pods' lease state."""
        if pods is None:
            keys = [k for k, s in self._ledger_pods.items() if s.namespace == namespace and s.shard == shard]
        else:
            keys = [object_key(namespace, name) for name in pods]
        for key in keys:
            known = self._ledger_pods.get(key)
            if known is not None and known.shard == shard:
                self._put(key, self._as_leased(known))

    def _as_leased(self, sandbox: SandboxPod) -> SandboxPod:
        if self._entry_of is None or sandbox.shard is None:
            return overlay(sandbox, None)
        return overlay(sandbox, self._entry_of(sandbox.namespace, sandbox.shard, sandbox.name))

    def _put(self, key: str, sandbox: SandboxPod) -> SandboxPod | None:
        """Keep a sandbox's reading; the one it replaced. Wakes its pool when anything it plans on changed."""
        pool_key = object_key(sandbox.namespace, sandbox.pool)
        members = self.sandboxes.setdefault(pool_key, {})
        previous = members.get(sandbox.name)
        members[sandbox.name] = sandbox
        self._pod_pool[key] = pool_key
        if sandbox.leased and previous is not None and previous.free:
            self.lease_times.setdefault(pool_key, deque()).append(time.time())
            if self._on_leased:
                self._on_leased(pool_key)
        if previous is None or _differs(previous, sandbox):
            self._on_pool_change(pool_key)
        return previous

    def _held_pods(self) -> Iterator[str]:
        """Every Pod the cache holds something of: capacity, or a place in a pool."""
        yield from self._pod_usage
        yield from (key for key in self._pod_pool if key not in self._pod_usage)

    def _forget_pod(self, key: str) -> None:
        self._set_usage(key, None)
        gone = self._ledger_pods.pop(key, None)
        if gone is not None and gone.shard is not None and self._on_ledger_pod_gone:
            self._on_ledger_pod_gone(gone.namespace, gone.shard, gone.name)
        pool_key = self._pod_pool.pop(key, None)
        if pool_key is not None:
            members = self.sandboxes.get(pool_key, {})
            members.pop(key.partition("/")[2], None)
            if not members:
                self.sandboxes.pop(pool_key, None)
            self._on_pool_change(pool_key)

    def _set_usage(self, key: str, usage: tuple[str, Resources] | None) -> None:
        old = self._pod_usage.pop(key, None) if usage is None else self._pod_usage.get(key)
        if old == usage:
            return
        if old is not None:
            node, amount = old
            self.usage[node] = self.usage.get(node, Resources()) - amount
        if usage is not None:
            node, amount = usage
            self.usage[node] = self.usage.get(node, Resources()) + amount
            self._pod_usage[key] = usage

    # -- nodes ----------------------------------------------------------------------------------------

    def _upsert_node(self, name: str, node: Node) -> None:
        self.nodes[name] = node

    def _forget_node(self, name: str) -> None:
        self.nodes.pop(name, None)

    # -- queries --------------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self.pods_synced.is_set() and self.nodes_synced.is_set()

    def pool_sandboxes(self, pool_key: str) -> list[SandboxPod]:
        return list(self.sandboxes.get(pool_key, {}).values())

    def spinup_seconds(self, pool_key: str) -> float | None:
        recent = self.startups.get(pool_key)
        return median(recent) if recent else None

    def recent_leases(self, pool_key: str, now: float) -> list[float]:
        times = self.lease_times.get(pool_key)
        if not times:
            return []
        while times and times[0] < now - LEASE_HISTORY_SECONDS:
            times.popleft()
        return list(times)


def _pod_key(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return object_key(str(meta.get("namespace")), str(meta.get("name")))


def _readable_node(body: dict[str, Any]) -> Node | None:
    """The Node as capacity planning reads it; None (skipped, logged) when it cannot be read."""
    try:
        return node_from_object(body)
    except ValueError:
        log.warning("cannot read the allocatable resources of node %s", body.get("metadata", {}).get("name"))
        return None


def _node_name(node: Node) -> str:
    return node.name


def _differs(a: SandboxPod, b: SandboxPod) -> bool:
    return (a.ready, a.state, a.node, a.terminating, a.broken, a.lease_expires_at) != (
        b.ready,
        b.state,
        b.node,
        b.terminating,
        b.broken,
        b.lease_expires_at,
    )
