"""The local backend's warm index, un-claim and lost sandboxes, over a fake runtime (no runsc needed)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandfleet.core import api
from sandfleet.core.leases import LeaseError
from sandfleet.core.limits import SandboxLimits
from sandfleet.core.model import image_key
from sandfleet.core.quotas import CapacityError
from sandfleet.gateway.lease_errors import UnknownName
from sandfleet.gateway.lease_requests import LeaseRequest
from sandfleet.gateway.leasing import LeaseService
from sandfleet.gateway.local import LocalBackend
from sandfleet.gateway.models import LeaseView
from sandfleet.local.artifacts import ImageRef
from sandfleet.local.runtime import RunscSandbox

IMG = ImageRef(Path("/nonexistent"), "img", "sha256:" + "0" * 64)


class FakeRuntime:
    """Creates sandboxes at once; remembers which were destroyed."""

    def __init__(self) -> None:
        self.ids = itertools.count()
        self.destroyed: list[str] = []
        self.loss_listeners: list[Callable[[RunscSandbox], None]] = []
        self.created: dict[str, RunscSandbox] = {}
        self.images: list[ImageRef] = []

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def add_image(self, image: ImageRef) -> None:
        self.images.append(image)

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
    backend = LocalBackend(runtime, "local", [IMG], warm=2)  # type: ignore[arg-type]
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
    backend = LocalBackend(runtime, "local", [IMG], warm=2)  # type: ignore[arg-type]
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


OTHER = ImageRef(Path("/nonexistent"), "task-other", "sha256:" + "1" * 64)


async def _until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def test_every_image_is_served_and_leased_by_image_with_its_digest_and_template_hash() -> None:
    runtime = FakeRuntime()
    backend = LocalBackend(runtime, "local", [IMG, OTHER], warm=1)  # type: ignore[arg-type]
    await backend.start()
    try:
        assert runtime.images == [IMG, OTHER]
        await _until(lambda: len(backend.warm("local", image_key(OTHER.tag))) == 1, "one warm of each")
        service = LeaseService(backend)
        assert service.pool_for_image(OTHER.tag) == "local"  # named by the pool, warm or not
        granted = await service.acquire(LeaseRequest(pool="local", holder="me", image=OTHER.tag))
        ((_, sandbox),) = granted.leases
        assert sandbox.image_key == image_key(OTHER.tag)
        assert sandbox.image_digest == OTHER.digest
        view = LeaseView.of(*granted.leases[0])
        assert (view.image_digest, view.template_hash) == (
            OTHER.digest,
            backend.served[sandbox.image_key].template_hash,
        )
        own = await service.acquire(LeaseRequest(pool="local", holder="me"))
        assert own.leases[0][1].image_digest == IMG.digest
        assert LeaseView.of(*own.leases[0]).template_hash != view.template_hash
        with pytest.raises(CapacityError, match="never 'nope:1'") as refused:
            await service.acquire(LeaseRequest(pool="local", holder="me", image="nope:1", wait_seconds=30))
        assert refused.value.code == "image_not_served"
        with pytest.raises(UnknownName, match="prefetch it"):
            service.pool_for_image("nope:1")
        observed = {
            s.labels["phase"] for m in backend.startup.collect() for s in m.samples if "phase" in s.labels
        }
        assert observed == {"scheduled", "started", "ready", "total"}
    finally:
        await backend.stop()


async def test_prefetch_warms_an_image_within_the_runtimes_capacity() -> None:
    runtime = FakeRuntime()
    backend = LocalBackend(runtime, "local", [IMG, OTHER], warm=1, max_sandboxes=8)  # type: ignore[arg-type]
    await backend.start()
    try:
        service = LeaseService(backend)
        await service.prefetch("local", [(OTHER.tag, 5)], ttl_seconds=600)
        await _until(lambda: len(backend.warm("local", image_key(OTHER.tag))) == 5, "five warm of the other")
        with pytest.raises(CapacityError, match="at most 8") as over:
            await service.prefetch("local", [(OTHER.tag, 8)], ttl_seconds=600)  # beside 1 warm of the first
        assert over.value.code == "prefetch_too_large"
        with pytest.raises(LeaseError, match="--image LAYOUT:TAG"):
            await service.prefetch("local", [("nope:1", 1)], ttl_seconds=600)
        await service.prefetch("local", [(OTHER.tag, 2)], ttl_seconds=0)  # back to its standing warm
        await _until(lambda: len(backend.warm("local", image_key(OTHER.tag))) == 1, "back to one warm")
    finally:
        await backend.stop()


async def test_a_group_larger_than_the_warm_count_is_booted_on_demand() -> None:
    runtime = FakeRuntime()
    backend = LocalBackend(runtime, "local", [IMG], warm=2)  # type: ignore[arg-type]
    await backend.start()
    try:
        await _until(lambda: len(backend.warm("local", image_key(IMG.tag))) == 2, "two warm")
        service = LeaseService(backend)
        granted = await asyncio.wait_for(
            service.acquire(LeaseRequest(pool="local", holder="me", count=6, wait_seconds=30)), 5
        )
        assert len({sandbox.key for _, sandbox in granted.leases}) == 6
        await _until(lambda: len(backend.warm("local", image_key(IMG.tag))) == 2, "the pool refilled")
        for _, sandbox in granted.leases[:3]:
            await backend.unclaim(backend.sandbox(sandbox.key))  # type: ignore[arg-type]
        assert len(backend.warm("local", image_key(IMG.tag))) == 5  # spares and pool ones alike
        await backend.release(granted.leases[3][1])
        assert granted.leases[3][1].name in runtime.destroyed
    finally:
        await backend.stop()
