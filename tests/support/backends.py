"""An in-memory Backend for the lease service's tests: conditional writes on resource versions."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import replace

from sandfleet.core import api
from sandfleet.core.leases import LeaseRecord
from sandfleet.core.model import SandboxPod, image_key, sandbox_key
from sandfleet.gateway.backend import IndexedReads, PoolInfo, SandboxIndex
from sandfleet.gateway.lease_requests import LeaseRequest

POOL = PoolInfo("ns", "python", 60, 600, ("us-east1", "europe-west4"), "img")


class MemoryBackend(IndexedReads):
    """Conditional writes on resource versions, like the apiserver; `steal` simulates rivals.

    `items` is the backends' own index: storing or deleting an item updates every view (as a watch
    would) without telling the listeners.
    """

    def __init__(self, steal_probability: float = 0.0, seed: int = 0) -> None:
        self.index = self.items = SandboxIndex()
        self.version = 0
        self.random = random.Random(seed)
        self.steal_probability = steal_probability
        self.stolen: set[str] = set()
        self.unclaimed: list[str] = []

    @property
    def listeners(self) -> list[Callable[[SandboxPod], None]]:
        return self.items.listeners

    @listeners.setter
    def listeners(self, listeners: list[Callable[[SandboxPod], None]]) -> None:
        self.items.listeners = listeners

    def add(self, name: str, region: str = "us-east1", image: str = "img") -> None:
        self.version += 1
        sandbox = SandboxPod("ns", name, "python", region, str(self.version), api.LEASE_FREE,
                          True, False, "127.0.0.1", 1, None, image_key=image_key(image))  # fmt: skip
        self.items.put(sandbox)

    def pool(self, name: str) -> PoolInfo | None:
        return POOL if name == "python" else None

    def pools(self) -> list[PoolInfo]:
        return [POOL]

    async def _write(self, sandbox: SandboxPod, state: str, lease: LeaseRecord | None) -> SandboxPod | None:
        await asyncio.sleep(self.random.random() / 1000)
        current = self.items.get(sandbox.key)
        if current is None or current.resource_version != sandbox.resource_version:
            return None
        if state == api.LEASE_LEASED and self.random.random() < self.steal_probability:
            self.version += 1  # a rival gateway got there first
            self.items[sandbox.key] = replace(current, state=api.LEASE_LEASED,
                                              resource_version=str(self.version))  # fmt: skip
            self.stolen.add(sandbox.key)
            return None
        self.version += 1
        updated = replace(current, state=state, lease=lease, resource_version=str(self.version))
        self.items[sandbox.key] = updated
        return updated

    async def claim(self, sandbox: SandboxPod, lease: LeaseRecord) -> SandboxPod | None:
        return await self._write(sandbox, api.LEASE_LEASED, lease)

    async def write_lease(self, sandbox: SandboxPod, lease: LeaseRecord) -> SandboxPod | None:
        return await self._write(sandbox, api.LEASE_LEASED, lease)

    async def unclaim(self, sandbox: SandboxPod) -> None:
        self.unclaimed.append(sandbox.key)
        if await self._write(sandbox, api.LEASE_FREE, None) is not None:
            self.items.notify(self.items[sandbox.key])

    async def release(self, sandbox: SandboxPod) -> None:
        current = self.items[sandbox.key]
        await self._write(current, api.LEASE_RELEASED, current.lease)

    async def fresh(self, lease_id: str) -> SandboxPod | None:
        return self.items.get(sandbox_key(lease_id))

    async def prefetch(self, pool: str, image: str, count: int, ttl_seconds: int) -> str:
        raise AssertionError("not used by the lease service")


def request(**overrides: object) -> LeaseRequest:
    """A lease request for the test pool, waiting up to 2 s unless overridden."""
    fields: dict[str, object] = {"pool": "python", "holder": "actor", "wait_seconds": 2.0}
    fields.update(overrides)
    return LeaseRequest(**fields)  # type: ignore[arg-type]


def warm(backend: MemoryBackend, count: int, prefix: str = "s") -> None:
    """Add `count` warm sandboxes, named `prefix` and a number."""
    for i in range(count):
        backend.add(f"{prefix}{i}")


def leased(backend: MemoryBackend) -> set[str]:
    """The keys of the sandboxes leased now."""
    return {key for key, s in backend.items.items() if s.state == api.LEASE_LEASED}
