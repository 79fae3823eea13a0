"""A coordination.k8s.io Lease renewed on a timer: the operator's leader election, the gateways' membership.

Both write the same fields (sandfleet.core.coordination) every `renew_seconds`, in one of two ways:

- `ContendedLease` (leader election): one Lease the replicas contend for. It is read, then created
  when absent, or written back conditionally on its resourceVersion (a lost race is a 409, never
  two holders) when it is unheld, ours, or its holder has been silent a whole duration by our clock;
- `OwnLease` (membership): a Lease per replica, named for it and labelled, that only it writes (a
  merge patch of its spec, a create when it is missing). Its peers read them with an Informer.

`held` is true until 0.8 of our lease duration after the start of the last write that landed: a
holder steps down a little before the others may take over, whatever happens to its renewals.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from sandfleet.core.coordination import (
    LastChange,
    duration_of,
    first_hold,
    handed_back,
    holder_of,
    may_take,
    renewal,
    taken,
)
from sandfleet.kube.api_calls import MERGE_PATCH, KubeClient
from sandfleet.kube.errors import KubeError

log = logging.getLogger(__name__)

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
# Failures a beat outlives (logged; the next beat tries again). Anything else is logged as unexpected.
FAILURES = (TimeoutError, KubeError, OSError)
# The share of a lease duration a holder counts itself the holder for after a write lands.
HELD_FRACTION = 0.8


def lease_object(
    name: str, spec: Mapping[str, Any], labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A new Lease named `name`, with `labels` when given."""
    metadata: dict[str, Any] = {"name": name}
    if labels is not None:
        metadata["labels"] = dict(labels)
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": dict(spec)}


class LeaseHeartbeat(abc.ABC):
    """One holder's Lease, written every `renew_seconds` while held (every `standby_seconds` while not)."""

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        what: str,
        lease_seconds: float = 15.0,
        renew_seconds: float = 5.0,
        standby_seconds: float | None = None,
        logger: logging.Logger = log,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.path = LEASES.format(namespace=namespace)
        self.name = name
        self.identity = identity
        self.what = what  # how the warnings of a failed beat begin
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self.standby_seconds = renew_seconds if standby_seconds is None else standby_seconds
        self.logger = logger
        self.clock = clock  # monotonic: how long we hold it, how long another has been silent
        self.wall_clock = wall_clock  # Unix seconds: the times written into the Lease
        self._held_until = 0.0

    @property
    def item(self) -> str:
        return f"{self.path}/{self.name}"

    @property
    def held(self) -> bool:
        return self.clock() < self._held_until

    @abc.abstractmethod
    async def beat(self) -> None:
        """One renewal of the Lease (KubeError, OSError or TimeoutError when it failed)."""

    @abc.abstractmethod
    async def release(self) -> None:
        """Give the Lease up on a clean stop, so the others go on without waiting out its duration."""

    async def run(
        self,
        then: Callable[[], Awaitable[None]] | None = None,
        after: Callable[[bool], None] | None = None,
    ) -> None:
        """Beat until cancelled, logging each failed beat.

        `then` runs after each beat that did not fail (its own failures logged alike); `after`
        after every beat, told whether the Lease was held before it.
        """
        while True:
            was_held = self.held
            try:
                await self.beat()
                if then is not None:
                    await then()
            except FAILURES as error:
                self.logger.warning("%s: %s", self.what, error)
            except Exception as error:
                self.logger.warning("%s: unexpected %r", self.what, error)
            if after is not None:
                after(was_held)
            await asyncio.sleep(self.renew_seconds if self.held else self.standby_seconds)

    def _landed(self, started: float) -> None:
        self._held_until = started + self.lease_seconds * HELD_FRACTION


class ContendedLease(LeaseHeartbeat):
    """The one Lease several replicas contend for: taken only when free, ours, or its holder's expired."""

    def __init__(self, kube: KubeClient, namespace: str, name: str, identity: str, **options: Any) -> None:
        super().__init__(kube, namespace, name, identity, **options)
        self._change = LastChange()

    async def beat(self) -> None:
        """Create the Lease, renew it, or take it over; `held` says whether we hold it now."""
        started = self.clock()
        lease = await self._get()
        if lease is None:
            if await self._write("POST", self.path, lease_object(self.name, self._first_hold())):
                self._landed(started)
            return
        current: dict[str, Any] = lease.get("spec") or {}
        silent = self._change.silent_for(lease, self.clock())
        if not may_take(holder_of(lease), self.identity, silent, duration_of(current)):
            self._held_until = 0.0
            return
        spec = taken(current, self.identity, self.lease_seconds, self.wall_clock())
        if await self._write("PUT", self.item, {**lease, "spec": spec}):
            self._landed(started)

    async def release(self) -> None:
        """Hand the Lease back (unheld, for a second) if we hold it, so another replica takes over at once."""
        if not self.held:
            return
        self._held_until = 0.0
        with contextlib.suppress(Exception):
            lease = await self._get()
            if lease and holder_of(lease) == self.identity:
                await self._write("PUT", self.item, {**lease, "spec": handed_back(lease["spec"])})

    def _first_hold(self) -> dict[str, Any]:
        return first_hold(self.identity, self.lease_seconds, self.wall_clock())

    async def _get(self) -> dict[str, Any] | None:
        try:
            return await self.kube.json("GET", self.item)
        except KubeError as error:
            if error.status == 404:
                return None
            raise

    async def _write(self, method: str, path: str, body: Mapping[str, Any]) -> bool:
        """Create or replace the Lease; False when someone else wrote it first (409)."""
        try:
            await self.kube.json(method, path, body=body)
            return True
        except KubeError as error:
            if error.status == 409:
                return False
            raise


class OwnLease(LeaseHeartbeat):
    """A Lease of this replica's own, labelled so its peers find it; nobody else renews it."""

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        labels: Mapping[str, str],
        **options: Any,
    ) -> None:
        super().__init__(kube, namespace, name, identity, **options)
        self.labels = dict(labels)

    async def beat(self) -> None:
        """Renew the Lease with a merge patch of its spec; create it when it is missing."""
        started = self.clock()
        spec = renewal(self.identity, self.lease_seconds, self.wall_clock())
        try:
            await self.kube.send("PATCH", self.item, body={"spec": spec}, content_type=MERGE_PATCH)
        except KubeError as error:
            if error.status != 404:
                raise
            await self.kube.send("POST", self.path, body=lease_object(self.name, spec, self.labels))
        self._landed(started)

    async def release(self) -> None:
        """Delete the Lease, so the peers see this replica leave now rather than after a duration."""
        self._held_until = 0.0
        await self.kube.send("DELETE", self.item)

    async def forget(self, name: str) -> None:
        """Delete a peer's Lease (a crashed replica leaves its own behind)."""
        await self.kube.send("DELETE", f"{self.path}/{name}")
