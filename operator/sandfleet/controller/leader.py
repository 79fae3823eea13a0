"""Leader election on a coordination.k8s.io Lease, so two or more operator replicas never act at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime
from typing import Any

from sandfleet.controller import metrics
from sandfleet.controller.kube import Kube, KubeError

log = logging.getLogger(__name__)


def _micro_time() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Holds (or waits for) one Lease; `is_leader` is true only while this replica renews it in time.

    A holder is presumed dead when its Lease has not changed for a whole lease duration by our own
    clock (as client-go does), so clock skew between replicas cannot make two leaders.
    """

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: float = 15.0,
        renew_seconds: float = 5.0,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self.changed = asyncio.Event()
        self._leader_until = 0.0
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0

    @property
    def is_leader(self) -> bool:
        return time.monotonic() < self._leader_until

    async def run(self) -> None:
        while True:
            was_leader = self.is_leader
            try:
                await self._try_acquire_or_renew()
            except (TimeoutError, KubeError, OSError) as error:
                log.warning("leader election: %s", error)
            except Exception as error:
                log.warning("leader election: unexpected %r", error)
            if self.is_leader != was_leader:
                log.info("%s leadership (%s)", "acquired" if self.is_leader else "lost", self.identity)
                metrics.LEADER.set(1 if self.is_leader else 0)
                self.changed.set()
            await asyncio.sleep(self.renew_seconds if self.is_leader else min(2.0, self.renew_seconds))

    async def _try_acquire_or_renew(self) -> None:
        started = time.monotonic()
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_seconds),
            "acquireTime": _micro_time(),
            "renewTime": _micro_time(),
            "leaseTransitions": 0,
        }
        lease = await self.kube.get_lease(self.namespace, self.name)
        if lease is None:
            if await self.kube.create_lease(self.namespace, self.name, spec):
                self._leader_until = started + self.lease_seconds * 0.8
            return
        current: dict[str, Any] = lease.get("spec") or {}
        holder = str(current.get("holderIdentity") or "")
        observed = (holder, str(lease["metadata"].get("resourceVersion")))
        if observed != self._observed:
            self._observed, self._observed_at = observed, time.monotonic()
        expired = time.monotonic() - self._observed_at > float(current.get("leaseDurationSeconds") or 15)
        if holder and holder != self.identity and not expired:
            self._leader_until = 0.0
            return
        renewed = dict(current)
        renewed.update(
            holderIdentity=self.identity,
            renewTime=_micro_time(),
            leaseDurationSeconds=int(self.lease_seconds),
        )
        if holder != self.identity:
            renewed["acquireTime"] = _micro_time()
            renewed["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
        if await self.kube.replace_lease(self.namespace, {**lease, "spec": renewed}):
            # Step down a little before the others may take over, whatever happens to our renewals.
            self._leader_until = started + self.lease_seconds * 0.8

    async def release(self) -> None:
        """Give the Lease up on a clean stop so another replica takes over at once."""
        if not self.is_leader:
            return
        self._leader_until = 0.0
        metrics.LEADER.set(0)
        with contextlib.suppress(Exception):
            lease = await self.kube.get_lease(self.namespace, self.name)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                spec = {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1}
                await self.kube.replace_lease(self.namespace, {**lease, "spec": spec})
