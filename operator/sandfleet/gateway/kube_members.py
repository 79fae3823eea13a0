"""Gateway replicas find each other through coordination.k8s.io Leases; each hands out its own share first.

Which replica a warm Pod belongs to first is `core.partition.owner` over the live replicas. It is
a preference, never a lock: every claim stays a conditional write on the Pod, so a replica whose
own share is empty takes from the others' (and may lose a race for one) without any double lease.
What it buys is that replicas seeing the same warm Pods stop racing for the same oldest ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sandfleet.core import api
from sandfleet.core.partition import live_members
from sandfleet.kube.api_calls import KubeClient
from sandfleet.kube.errors import KubeError
from sandfleet.kube.heartbeat import OwnLease
from sandfleet.kube.informer import Informer
from sandfleet.kube.keyed_feed import KeyedFeed

log = logging.getLogger(__name__)


def default_identity() -> str:
    """The name of this replica among the others: its Pod's name in a cluster, else host and process."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def lease_name(identity: str) -> str:
    """A DNS-1123 name for the replica's Lease (identities may hold characters a name may not)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", identity.lower()).strip("-")[:200] or "replica"
    return f"sandfleet-gateway-{slug}"


class GatewayMembers:
    """Renews this replica's Lease and watches the others'; tells `on_change` the live replicas.

    The renewing is sandfleet.kube.heartbeat's `OwnLease`; the watching, an Informer on the label.
    """

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        identity: str,
        on_change: Callable[[tuple[str, ...]], None],
        lease_seconds: float = 15.0,
        renew_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.identity = identity
        self.name = lease_name(identity)
        self.lease = OwnLease(
            kube,
            namespace,
            self.name,
            identity,
            labels={api.GATEWAY_MEMBER_LABEL: "true"},
            what=f"gateway membership: cannot renew {self.name}",
            lease_seconds=lease_seconds,
            renew_seconds=renew_seconds,
            logger=log,
            clock=clock,
        )
        self.kube = kube
        self.path = self.lease.path
        self.on_change = on_change
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.members: tuple[str, ...] = (identity,)
        self._last_seen: dict[str, float] = {}
        self._lease_names: dict[str, str] = {}  # holder -> its Lease's name
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        # A relist is taken whole, so the live replicas are counted once, on all of it.
        feed = KeyedFeed(
            _member_lease,
            _holder,
            self._seen,
            self._left,
            lambda: self._last_seen,
            self._recount,
            replace=self._relisted,
        )
        informer = Informer(
            self.kube,
            self.path,
            feed.on_event,
            feed.on_synced,
            query={"labelSelector": api.GATEWAY_MEMBER_LABEL},
            resource="leases",
        )
        renewing = self.lease.run(then=self._forget_the_dead, after=lambda _: self._recount())
        self._tasks = [asyncio.create_task(informer.run()), asyncio.create_task(renewing)]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # Leave at once, so the others take this replica's share now rather than after a lease.
        with contextlib.suppress(KubeError, OSError, TimeoutError):
            await self.lease.release()

    async def _forget_the_dead(self) -> None:
        """Delete the Leases of replicas silent for two lease durations (a crashed Pod leaves its own)."""
        now = self.clock()
        for holder, seen in list(self._last_seen.items()):
            if holder != self.identity and now - seen > 2 * self.lease_seconds:
                del self._last_seen[holder]
                name = self._lease_names.pop(holder, None)
                if name is not None:
                    with contextlib.suppress(KubeError):  # another replica deleted it first
                        await self.lease.forget(name)

    def _seen(self, holder: str, lease: dict[str, Any]) -> None:
        self._last_seen[holder] = self.clock()
        self._lease_names[holder] = str(lease["metadata"]["name"])
        self._recount()

    def _left(self, holder: str) -> None:
        self._last_seen.pop(holder, None)
        self._recount()

    def _relisted(self, listed: dict[str, dict[str, Any]], gone: list[str]) -> None:
        """The replicas a relist showed, seen now; the others are forgotten."""
        self._last_seen = {}
        for holder, lease in listed.items():
            self._last_seen[holder] = self.clock()
            self._lease_names[holder] = str(lease["metadata"]["name"])

    def _recount(self) -> None:
        members = live_members(self._last_seen, self.identity, self.clock(), self.lease_seconds)
        if members != self.members:
            log.info("gateway replicas: %s", ", ".join(members))
            self.members = members
            self.on_change(members)


def _member_lease(lease: dict[str, Any]) -> dict[str, Any] | None:
    """A watched Lease, if it names its holder."""
    return lease if _holder(lease) else None


def _holder(lease: dict[str, Any]) -> str:
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


class ReplicasGauge(Collector):
    """`sandfleet_gateway_replicas`: how many replicas this one shares the warm sandboxes with."""

    def __init__(self, count: Callable[[], int]) -> None:
        self.count = count

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "sandfleet_gateway_replicas",
            "Gateway replicas sharing the warm sandboxes (live membership Leases, this one included).",
            value=self.count(),
        )
