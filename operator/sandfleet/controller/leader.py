"""Leader election on a coordination.k8s.io Lease, so two or more operator replicas never act at once."""

from __future__ import annotations

import asyncio
import logging

from sandfleet.controller import metrics
from sandfleet.kube.api_calls import KubeClient
from sandfleet.kube.heartbeat import ContendedLease

log = logging.getLogger(__name__)


class LeaderElector:
    """Holds (or waits for) one Lease; `is_leader` is true only while this replica renews it in time.

    The Lease is the one sandfleet.kube.heartbeat contends for: taken only when free, ours, or its
    holder has been silent a whole duration by our own clock. A replica that does not lead tries
    again every 2 s (or `renew_seconds` if sooner), so it takes over soon after the leader is gone.
    """

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: float = 15.0,
        renew_seconds: float = 5.0,
    ) -> None:
        self.identity = identity
        self.lease = ContendedLease(
            kube,
            namespace,
            name,
            identity,
            what="leader election",
            lease_seconds=lease_seconds,
            renew_seconds=renew_seconds,
            standby_seconds=min(2.0, renew_seconds),
            logger=log,
        )
        self.changed = asyncio.Event()

    @property
    def is_leader(self) -> bool:
        return self.lease.held

    async def run(self) -> None:
        await self.lease.run(after=self._after_beat)

    def _after_beat(self, was_leader: bool) -> None:
        if self.is_leader != was_leader:
            log.info("%s leadership (%s)", "acquired" if self.is_leader else "lost", self.identity)
            metrics.LEADER.set(1 if self.is_leader else 0)
            self.changed.set()

    async def release(self) -> None:
        """Give the Lease up on a clean stop so another replica takes over at once."""
        if not self.is_leader:
            return
        metrics.LEADER.set(0)
        await self.lease.release()
