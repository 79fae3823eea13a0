"""A caller who gives up (disconnects, is cancelled) leaves no lease behind and no queue place taken."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest

from sandfleet.core import api
from sandfleet.core.leases import LeaseRecord
from sandfleet.core.model import SandboxPod
from sandfleet.gateway.lease_errors import WaitTimeout
from sandfleet.gateway.lease_requests import Granted
from sandfleet.gateway.leasing import LeaseService
from tests.support.backends import MemoryBackend, request


class SlowBackend(MemoryBackend):
    """Claims take `claim_seconds`; claims on `rivals` lose to another gateway (a 409).

    `gated`: every claim, once started, waits at `gate` until the test opens it (`gate.set()`);
    `claims_started` waits for claims to start, on their own signal rather than on the clock.
    """

    def __init__(
        self,
        claim_seconds: float = 0.0,
        rivals: frozenset[str] = frozenset(),
        seed: int = 0,
        gated: bool = False,
    ) -> None:
        super().__init__(seed=seed)
        self.claim_seconds = claim_seconds
        self.rivals = rivals
        self.gate = asyncio.Event()
        if not gated:
            self.gate.set()
        self.started = 0
        self._a_claim_started = asyncio.Event()

    async def claim(self, sandbox: SandboxPod, lease: LeaseRecord) -> SandboxPod | None:
        self.started += 1
        self._a_claim_started.set()
        await self.gate.wait()
        await asyncio.sleep(self.claim_seconds)
        if sandbox.key in self.rivals:
            self.version += 1
            self.items[sandbox.key] = replace(
                sandbox, state=api.LEASE_LEASED, resource_version=str(self.version)
            )
            return None
        return await super().claim(sandbox, lease)

    async def claims_started(self, count: int) -> None:
        """Until `count` claims have started (with the gate shut: they are all in flight now)."""

        async def enough() -> None:
            while self.started < count:
                self._a_claim_started.clear()
                await self._a_claim_started.wait()

        await asyncio.wait_for(enough(), 10)  # a guard against hanging, not a timing assumption


async def settle(service: LeaseService) -> None:
    """Let background claims and un-claims finish."""
    for _ in range(100):
        await asyncio.sleep(0.01)
        if not service.queues.background:
            return
    raise AssertionError("background claims never finished")


def states(backend: MemoryBackend) -> dict[str, str]:
    return {key: s.state for key, s in backend.items.items()}


async def test_cancelled_while_queued_leaves_the_queue_and_the_sandbox_free() -> None:
    backend = MemoryBackend()
    service = LeaseService(backend)
    waiting = asyncio.create_task(service.acquire(request(wait_seconds=5)))
    await asyncio.sleep(0.01)
    assert service.waiting("python") == 1
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert service.waiting("python") == 0
    backend.add("s0")  # the sandbox it was waiting for arrives after it left
    await settle(service)
    assert states(backend) == {"ns.s0": api.LEASE_FREE}
    granted = await service.acquire(request())
    assert granted.leases[0][0].id == "ns.s0"


async def test_cancelled_while_its_claim_is_in_flight_gives_the_sandbox_back() -> None:
    backend = SlowBackend(gated=True)
    backend.add("s0")
    backend.add("s1")
    service = LeaseService(backend)
    pending = asyncio.create_task(service.acquire(request(count=2)))
    await backend.claims_started(2)  # both claims are being written, held at the gate
    pending.cancel()
    await asyncio.gather(pending, return_exceptions=True)
    assert backend.started == 2  # cancelled while both claims were in flight, before either landed
    assert not backend.unclaimed
    backend.gate.set()  # they land now, for a caller who has gone
    await settle(service)
    assert sorted(backend.unclaimed) == ["ns.s0", "ns.s1"]
    assert set(states(backend).values()) == {api.LEASE_FREE}
    assert len(backend.warm("python", backend.items["ns.s0"].image_key)) == 2
    again = await service.acquire(request(count=2))  # the gate stays open
    assert sorted(lease.id for lease, _ in again.leases) == ["ns.s0", "ns.s1"]


async def test_cancelled_after_a_partial_group_claim_returns_what_it_got() -> None:
    backend = SlowBackend(rivals=frozenset({"ns.s1"}), gated=True)
    backend.add("s0")
    backend.add("s1")
    service = LeaseService(backend)
    # Its wait only guards against hanging: the test cancels the group, never lets it time out.
    group = asyncio.create_task(service.acquire(request(count=2, wait_seconds=60)))
    await backend.claims_started(2)
    backend.gate.set()
    await settle(service)  # s0 landed, s1 went to a rival: the group waits at the head for one
    assert service.waiting("python") == 1
    assert backend.items["ns.s0"].state == api.LEASE_LEASED
    group.cancel()
    await asyncio.gather(group, return_exceptions=True)
    await settle(service)
    assert backend.items["ns.s0"].state == api.LEASE_FREE
    assert service.waiting("python") == 0
    assert (await service.acquire(request())).leases[0][0].id == "ns.s0"


async def test_a_cancelled_group_at_the_head_lets_the_next_caller_through() -> None:
    backend = MemoryBackend()
    backend.add("s0")
    # Never overtaken: the group collects s0 at once and holds it while it waits for two more.
    service = LeaseService(backend, overtake_seconds=0)
    group = asyncio.create_task(service.acquire(request(count=3, wait_seconds=5)))
    await asyncio.sleep(0.01)
    single = asyncio.create_task(service.acquire(request(wait_seconds=5)))
    await asyncio.sleep(0.01)
    assert service.waiting("python") == 2
    group.cancel()
    granted = await asyncio.wait_for(single, 1)
    assert granted.leases[0][0].id == "ns.s0"


async def test_a_shared_idempotent_acquire_is_called_off_only_when_every_retry_has_gone() -> None:
    backend = MemoryBackend()
    service = LeaseService(backend)
    first = asyncio.create_task(service.acquire(request(idempotency_key="k", wait_seconds=5)))
    await asyncio.sleep(0.01)
    retry = asyncio.create_task(service.acquire(request(idempotency_key="k", wait_seconds=5)))
    await asyncio.sleep(0.01)
    first.cancel()  # the client's first connection dropped; its retry still waits
    await asyncio.gather(first, return_exceptions=True)
    backend.add("s0")
    granted = await asyncio.wait_for(retry, 1)
    assert granted.leases[0][0].id == "ns.s0"
    alone = asyncio.create_task(service.acquire(request(idempotency_key="k2", wait_seconds=5)))
    await asyncio.sleep(0.01)
    alone.cancel()
    await asyncio.gather(alone, return_exceptions=True)
    assert service.waiting("python") == 0
    backend.add("s1")
    retried = await service.acquire(request(idempotency_key="k2"))  # a later retry starts afresh
    assert retried.leases[0][0].id == "ns.s1"


@pytest.mark.parametrize("seed", range(4))
async def test_random_cancellations_never_leak_or_double_lease(seed: int) -> None:
    rng = random.Random(seed)
    backend = SlowBackend(claim_seconds=0.005, seed=seed)
    backend.steal_probability = 0.1
    service = LeaseService(backend)
    tasks: list[asyncio.Task[Granted]] = []
    for i in range(80):
        count = rng.choice([1, 1, 2, 3])
        tasks.append(asyncio.create_task(service.acquire(request(count=count, wait_seconds=0.5))))
        for _ in range(rng.choice([0, 1, 2, 3])):
            backend.add(f"s{i}-{_}", rng.choice(["us-east1", "europe-west4"]))
        if rng.random() < 0.5:
            victim = rng.choice(tasks[-5:])
            asyncio.get_running_loop().call_later(rng.random() / 100, victim.cancel)
        await asyncio.sleep(rng.random() / 200)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    await settle(service)
    granted = [lease.id for r in results if isinstance(r, Granted) for lease, _ in r.leases]
    assert len(granted) == len(set(granted)), "a sandbox was leased twice"
    leased = {k for k, s in backend.items.items() if s.state == api.LEASE_LEASED} - backend.stolen
    assert leased == set(granted), "a sandbox is leased to nobody"
    errors = [r for r in results if isinstance(r, BaseException)]
    assert all(isinstance(e, WaitTimeout | asyncio.CancelledError) for e in errors)
    assert backend.unclaimed, "no cancellation landed on a claim: the test lost its point"
    assert service.waiting("python") == 0


@pytest.mark.parametrize("seed", range(30))
async def test_a_retry_through_another_replica_never_keeps_a_sandbox_that_was_given_back(seed: int) -> None:
    """Replica A un-claims for a caller who left while that caller's retry reaches replica B.

    Both writes are conditional on the claim's version: B either keeps the lease (A's un-claim
    loses) or finds none and leases afresh (its renewal loses); never a lease on a warm sandbox.
    """
    backend = SlowBackend(claim_seconds=0.002, seed=seed)
    backend.add("s0")
    backend.add("s1")
    replica_a, replica_b = LeaseService(backend), LeaseService(backend)
    first = asyncio.create_task(replica_a.acquire(request(idempotency_key="k")))
    await asyncio.sleep(0.001)
    first.cancel()  # the client hung up while its claim was in flight
    while backend.items["ns.s0"].state != api.LEASE_LEASED:  # noqa: ASYNC110 (the store has no events)
        await asyncio.sleep(0)
    retried = await replica_b.acquire(request(idempotency_key="k", wait_seconds=1))
    await asyncio.gather(first, return_exceptions=True)
    await settle(replica_a)
    await settle(replica_b)
    ((lease, _),) = retried.leases
    assert backend.items[lease.id].state == api.LEASE_LEASED
    leased = [k for k, s in backend.items.items() if s.state == api.LEASE_LEASED]
    assert leased == [lease.id], "a sandbox is leased to nobody, or the retry's is warm"
