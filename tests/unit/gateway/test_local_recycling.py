"""The local backend's recycling bookkeeping over a fake runtime: same run only, K episodes, failed resets.

Real resets (runsc restore, the rekey, the probe) are proven in tests/e2e/local/test_recycle.py;
this checks who gets a reset sandbox, under which name, and that nothing is leased twice or leaked.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sandfleet.core import api
from sandfleet.core.model import image_key
from sandfleet.core.recycle import RecyclePolicy
from sandfleet.gateway.lease_requests import LeaseRequest
from sandfleet.gateway.leasing import LeaseService
from sandfleet.gateway.local import LocalBackend
from sandfleet.local.errors import LocalRuntimeError
from sandfleet.local.runtime import ResetFailed, RunscSandbox
from tests.unit.gateway.test_local_backend import IMG, FakeRuntime, _until


class FakeRecyclingRuntime(FakeRuntime):
    """Resets at once (or fails as told); names follow rekeys as the real runtime's do."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_reset: Exception | None = None
        self.resets: list[str] = []
        self.forgotten = 0

    async def create_restored(self, spec: Any = None) -> RunscSandbox:
        return await self.create(spec)

    async def golden(self, spec: Any = None) -> object:
        return "golden"

    def forget_golden(self, golden: object) -> None:
        self.forgotten += 1

    async def reset(self, sandbox: RunscSandbox, golden: object, name: str) -> dict[str, float]:
        await asyncio.sleep(0)
        if self.fail_reset is not None:
            self.release(sandbox)
            raise self.fail_reset
        self.resets.append(sandbox.id)
        sandbox.name = name
        return {}

    async def rekey(self, sandbox: RunscSandbox, name: str) -> None:
        sandbox.name = name


async def _backend(max_episodes: int = 3) -> tuple[FakeRecyclingRuntime, LocalBackend, LeaseService]:
    runtime = FakeRecyclingRuntime()
    policy = RecyclePolicy(max_episodes=max_episodes, max_seconds=3600)
    backend = LocalBackend(runtime, "local", [IMG], warm=2, recycle=policy)  # type: ignore[arg-type]
    await backend.start()
    await _until(lambda: len(backend.warm("local", image_key("img"))) == 2, "two warm")
    return runtime, backend, LeaseService(backend)


async def _episode(
    backend: LocalBackend, service: LeaseService, run: str | None, holder: str = "me"
) -> tuple[str, str]:
    """Lease, then release: the lease id and the runsc sandbox that served it."""
    labels = {"run": run} if run else {}
    ((lease, sandbox),) = (
        await service.acquire(LeaseRequest(pool="local", holder=holder, labels=labels))
    ).leases
    assert sandbox.state == api.LEASE_LEASED
    served = backend._local[lease.id].id
    assert await service.release(lease.id, holder)
    return lease.id, served


def _resets(backend: LocalBackend, result: str) -> float:
    """The resets counted with `result`, as the metric exports them."""
    return sum(
        sample.value
        for metric in backend.resets.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels == {"pool": "local", "result": result}
    )


async def test_a_run_s_next_episode_gets_its_reset_sandbox_under_a_new_name() -> None:
    runtime, backend, service = await _backend()
    try:
        first_lease, first = await _episode(backend, service, "r1")
        await _until(lambda: _resets(backend, "recycled") == 1, "reset")
        ((lease, _),) = (
            await service.acquire(LeaseRequest(pool="local", holder="me", labels={"run": "r1"}))
        ).leases
        assert backend._local[lease.id].id == first  # the same runsc sandbox
        assert lease.id != first_lease  # a lease (and token) of its own
        assert backend.sandbox(first_lease).state == api.LEASE_RELEASED  # type: ignore[union-attr]
        assert first not in runtime.destroyed
        # The fresh sandbox the lease service picked is still warm, under a new name.
        warm = backend.warm("local", image_key("img"))
        assert len(warm) == 2
        assert all(backend._local[s.key].id != first for s in warm.sandboxes())
        assert len({backend._local[s.key].id for s in backend.sandboxes()}) == len(backend.sandboxes())
    finally:
        await backend.stop()


async def test_another_run_or_holder_never_gets_it_and_a_lease_without_run_is_destroyed() -> None:
    runtime, backend, service = await _backend()
    try:
        _, first = await _episode(backend, service, "r1")
        await _until(lambda: _resets(backend, "recycled") == 1, "reset")
        for run, holder in (("r2", "me"), ("r1", "someone-else"), (None, "me")):
            _, served = await _episode(backend, service, run, holder)
            assert served != first
        assert len(runtime.resets) == 3  # r2's and someone-else's r1 were recycled for themselves
        _, unlabelled = await _episode(backend, service, None)
        assert unlabelled in runtime.destroyed
    finally:
        await backend.stop()


async def test_a_sandbox_serves_at_most_k_episodes_then_is_destroyed() -> None:
    runtime, backend, service = await _backend(max_episodes=3)
    try:
        served = []
        for episode in range(4):
            _, sandbox = await _episode(backend, service, "r1")
            served.append(sandbox)

            def ended(n: int = episode) -> bool:
                return len(runtime.resets) + len(runtime.destroyed) > n

            await _until(ended, "ended")
        assert served[0] == served[1] == served[2]
        assert served[3] != served[0]
        assert served[0] in runtime.destroyed
    finally:
        await backend.stop()


async def test_a_failed_reset_destroys_the_sandbox_and_the_next_lease_gets_another() -> None:
    for failure, result in (
        (ResetFailed("x", ["/workspace differs"]), "probe_failed"),
        (LocalRuntimeError("restore failed"), "restore_failed"),
    ):
        runtime, backend, service = await _backend()
        try:
            runtime.fail_reset = failure
            _, first = await _episode(backend, service, "r1")

            def counted(r: str = result, b: LocalBackend = backend) -> bool:
                return _resets(b, r) == 1

            await _until(counted, result)
            assert first in runtime.destroyed
            assert runtime.forgotten == (result == "restore_failed")
            _, second = await _episode(backend, service, "r1")
            assert second != first
        finally:
            await backend.stop()


async def test_an_unclaimed_reset_sandbox_waits_for_its_run_again() -> None:
    _, backend, service = await _backend()
    try:
        _, first = await _episode(backend, service, "r1")
        await _until(lambda: _resets(backend, "recycled") == 1, "reset")
        ((lease, sandbox),) = (
            await service.acquire(LeaseRequest(pool="local", holder="me", labels={"run": "r1"}))
        ).leases
        await backend.unclaim(sandbox)
        assert backend.sandbox(lease.id) is None
        _, again = await _episode(backend, service, "r1")
        assert again == first
    finally:
        await backend.stop()
