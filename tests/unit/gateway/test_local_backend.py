"""The local backend's warm index, un-claim and lost sandboxes, over a fake runtime (no runsc needed)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandfleet.core import api
from sandfleet.core.limits import SandboxLimits
from sandfleet.core.model import image_key
from sandfleet.gateway.leasing import LeaseRequest, LeaseService
from sandfleet.gateway.local import LocalBackend
from sandfleet.local.runtime import RunscSandbox


class FakeRuntime:
    """Creates sandboxes at once; remembers which were destroyed."""

    def __init__(self) -> None:
        self.ids = itertools.count()
        self.destroyed: list[str] = []
        self.loss_listeners: list[Callable[[RunscSandbox], None]] = []
        self.created: dict[str, RunscSandbox] = {}

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def create(self, spec: Any = None) -> RunscSandbox:
        await asyncio.sleep(0)
        n = next(self.ids)
        sandbox = RunscSandbox(f"sb{n}", n, "127.0.0.1", 9000 + n, Path("/nonexistent"), SandboxLimits())
        self.created[sandbox.id] = sandbox
        return sandbox

    def die(self, name: str) -> None:
        """What the runtime does when a sandbox's runsc processes exit unasked."""
        for listener in self.loss_listeners:
            listener(self.created[name])

    def release(self, sandbox: RunscSandbox) -> None:
        self.destroyed.append(sandbox.id)


async def test_unclaimed_sandboxes_are_warm_again_and_released_ones_leave_the_index() -> None:
    runtime = FakeRuntime()
    backend = LocalBackend(runtime, "local", "img", warm=2)  # type: ignore[arg-type]
    await backend.start()
    try:
        warm = backend.warm("local", image_key("img"))
        for _ in range(100):
            if len(warm) == 2:
                break
            await asyncio.sleep(0.01)
        service = LeaseService(backend)
        granted = await service.acquire(LeaseRequest(pool="local", holder="me"))
        ((lease, sandbox),) = granted.leases
        assert sandbox.state == api.LEASE_LEASED
        assert lease.id not in warm
        await backend.unclaim(sandbox)
        assert backend.sandbox(lease.id).state == api.LEASE_FREE  # type: ignore[union-attr]
        assert lease.id in warm
        again = await service.acquire(LeaseRequest(pool="local", holder="me"))
        assert again.leases[0][0].id == lease.id  # the oldest warm one, back in line
        await backend.release(again.leases[0][1])
        assert lease.id not in warm
        assert lease.id.removeprefix("local.") in runtime.destroyed
    finally:
        await backend.stop()


async def test_a_lost_sandbox_loses_its_address_when_leased_and_its_place_when_warm() -> None:
    runtime = FakeRuntime()
    backend = LocalBackend(runtime, "local", "img", warm=2)  # type: ignore[arg-type]
    heard: list[str] = []
    backend.subscribe(lambda sandbox: heard.append(f"{sandbox.name}:{sandbox.address}"))
    await backend.start()
    try:
        warm = backend.warm("local", image_key("img"))
        for _ in range(100):
            if len(warm) == 2:
                break
            await asyncio.sleep(0.01)
        granted = await LeaseService(backend).acquire(LeaseRequest(pool="local", holder="me"))
        ((lease, leased),) = granted.leases
        runtime.die(leased.name)
        after = backend.sandbox(lease.id)
        assert after is not None
        assert after.address is None
        assert after.lease is not None
        assert heard[-1] == f"{leased.name}:None"  # the proxy hears it and ends calls in flight
        spare = next(s for s in backend.sandboxes() if s.state == api.LEASE_FREE)
        runtime.die(spare.name)
        assert spare.key not in warm
        assert spare.name in runtime.destroyed
    finally:
        await backend.stop()
