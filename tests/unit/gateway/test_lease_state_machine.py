"""The lease service as a state machine: any mix of acquires, renewals, releases, expiries and rivals."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, precondition, rule

from sandfleet.core import api
from sandfleet.core.leases import LeaseError
from sandfleet.gateway.lease_errors import (
    KeyReused,
    LeaseGone,
    NotTheHolder,
    PoolQueueFull,
    UnknownName,
    WaitTimeout,
)
from sandfleet.gateway.lease_requests import LeaseRequest
from sandfleet.gateway.leasing import LeaseService
from tests.support.backends import MemoryBackend

HOLDERS = ("actor-a", "actor-b")
RUNS = ("run-1", "run-2")
REGIONS = ("us-east1", "europe-west4")


class LeaseMachine(RuleBasedStateMachine):
    """A model of which lease each holder has, checked against the service and the backend after every step.

    The backend is the in-memory conditional store (resource versions, like the apiserver); a
    "rival" rule writes to it behind the service's back, as another gateway replica would.
    """

    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.backend = MemoryBackend(seed=3)
        self.now = 10_000.0
        self.service = LeaseService(self.backend, clock=lambda: self.now, max_waiting=4)
        self.names = itertools.count()
        # lease id -> (holder, run, expires_at) for every lease the model believes is live
        self.live: dict[str, tuple[str, str | None, float]] = {}
        self.ended: set[str] = set()  # released, expired, stolen or reaped: never valid again
        # lease id -> (idempotency key, what the request asked for) for the keyed ones
        self.asked: dict[str, tuple[str, tuple[object, ...]]] = {}
        self.granted_ever: list[str] = []

    def teardown(self) -> None:
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def _expire_model(self) -> None:
        for lease_id, (_, _, expires_at) in list(self.live.items()):
            if self.now >= expires_at:
                del self.live[lease_id]
                self.ended.add(lease_id)

    def _renewed_by_a_retry(self, holder: str, key: str) -> None:
        """A keyed retry that fell short renewed the leases it found under its key (the write that
        settles a race with an un-claim): they stay the holder's, their expiry moved forward only."""
        for lease_id, (owner, run, expires_at) in list(self.live.items()):
            lease = self.backend.items[lease_id].lease
            assert lease is not None
            if owner == holder and lease.idempotency_key == key:
                assert lease.expires_at >= expires_at, f"a failed retry moved {lease_id}'s expiry back"
                self.live[lease_id] = (owner, run, lease.expires_at)

    def _held_by_another(self, lease_id: str, holder: str) -> bool:
        """NotTheHolder is the answer while the sandbox still carries another caller's lease (live or not)."""
        sandbox = self.backend.items.get(lease_id)
        return sandbox is not None and sandbox.lease is not None and sandbox.lease.holder != holder

    # -- the world -----------------------------------------------------------------------------

    @rule(region=st.sampled_from(REGIONS), count=st.integers(1, 3))
    def warm_sandboxes_arrive(self, region: str, count: int) -> None:
        for _ in range(count):
            self.backend.add(f"s{next(self.names)}", region)

    @rule(seconds=st.sampled_from([1.0, 30.0, 61.0, 700.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self._expire_model()

    @rule()
    def operator_reaps_ended_sandboxes(self) -> None:
        """The operator deletes released sandboxes and those whose lease expired."""
        for key, sandbox in list(self.backend.items.items()):
            expired = sandbox.lease is not None and sandbox.lease.expired(self.now)
            if sandbox.state == api.LEASE_RELEASED or (sandbox.state == api.LEASE_LEASED and expired):
                del self.backend.items[key]
                self.live.pop(key, None)
                self.ended.add(key)

    @rule()
    def rival_gateway_takes_a_warm_sandbox(self) -> None:
        """Another replica claims a warm sandbox: this service must never hand it out afterwards."""
        from dataclasses import replace

        for key, sandbox in self.backend.items.items():
            if sandbox.state == api.LEASE_FREE:
                self.backend.version += 1
                self.backend.items[key] = replace(
                    sandbox, state=api.LEASE_LEASED, resource_version=str(self.backend.version)
                )
                self.backend.stolen.add(key)
                self.ended.add(key)
                return

    # -- the API -------------------------------------------------------------------------------

    @rule(
        target=leases,
        holder=st.sampled_from(HOLDERS),
        count=st.integers(1, 3),
        run=st.none() | st.sampled_from(RUNS),
        region=st.none() | st.sampled_from(REGIONS),
        ttl=st.none() | st.sampled_from([1, 60, 600, 601, 0, -5]),
        key=st.none() | st.sampled_from(["k1", "k2"]),
        least=st.none() | st.integers(1, 3),  # a batch when below count
    )
    def acquire(
        self,
        holder: str,
        count: int,
        run: str | None,
        region: str | None,
        ttl: int | None,
        key: str | None,
        least: int | None,
    ) -> Any:
        min_count = None if least is None else min(least, count)
        asked = (count, count if min_count is None else min_count, ttl, run, region)
        # The key is in use for another request while a live lease of the holder's carries it.
        reused = key is not None and any(
            self.asked.get(i, ("", ()))[0] == key and self.asked[i][1] != asked and h == holder
            for i, (h, _, _) in self.live.items()
        )
        request = LeaseRequest(
            pool="python",
            holder=holder,
            count=count,
            regions=(region,) if region else (),
            ttl_seconds=ttl,
            labels={"run": run} if run else {},
            idempotency_key=key,
            wait_seconds=0.02,
            min_count=min_count,
        )
        try:
            granted = self.run(self.service.acquire(request))
        except LeaseError:
            assert ttl is not None
            assert ttl <= 0 or ttl > 600
            return multiple()
        except KeyReused:
            assert reused, "a retry of the same request was refused as another request"
            return multiple()
        except (WaitTimeout, PoolQueueFull):
            assert not reused, "a key in use for another request was queued"
            if key is not None:
                self._renewed_by_a_retry(holder, key)
            return multiple()
        assert not reused, "a key in use for another request was answered"
        if key is None:
            assert request.least <= len(granted.leases) <= count, "all or nothing, or a batch's range"
        ids = []
        for lease, sandbox in granted.leases:
            assert lease.holder == holder
            assert sandbox.state == api.LEASE_LEASED
            if lease.id not in self.live:
                assert lease.id not in self.ended, f"{lease.id} was handed out again after it ended"
                assert lease.id not in self.backend.stolen, f"{lease.id} was leased by a rival first"
                self.live[lease.id] = (holder, run, lease.expires_at)
                self.granted_ever.append(lease.id)
            else:
                # Only an idempotent retry may return a lease that is already live, to the same holder;
                # it renews the lease on the way (the write that settles a race with an un-claim).
                assert key is not None
                assert self.live[lease.id][0] == holder
                self.live[lease.id] = (holder, self.live[lease.id][1], lease.expires_at)
            ids.append(lease.id)
            if key is not None:
                self.asked[lease.id] = (key, asked)
        return multiple(*ids)

    @rule(lease_id=leases, holder=st.sampled_from(HOLDERS))
    def look_up(self, lease_id: str, holder: str) -> None:
        try:
            lease, _ = self.run(self.service.current(lease_id, holder))
        except NotTheHolder:
            assert self._held_by_another(lease_id, holder)
            return
        except (LeaseGone, UnknownName):
            assert lease_id not in self.live
            return
        assert lease_id in self.live
        assert self.live[lease_id][0] == holder == lease.holder

    @rule(lease_id=leases, holder=st.sampled_from(HOLDERS), ttl=st.none() | st.sampled_from([30, 600, 601]))
    def renew(self, lease_id: str, holder: str, ttl: int | None) -> None:
        try:
            renewed = self.run(self.service.renew(lease_id, holder, ttl))
        except NotTheHolder:
            assert self._held_by_another(lease_id, holder)
            return
        except (LeaseGone, UnknownName):
            assert lease_id not in self.live
            return
        except LeaseError:
            assert ttl == 601
            return
        assert lease_id in self.live
        assert self.live[lease_id][0] == holder
        assert renewed.expires_at > self.now
        self.live[lease_id] = (holder, self.live[lease_id][1], renewed.expires_at)

    @rule(lease_id=consumes(leases), holder=st.sampled_from(HOLDERS))
    def release(self, lease_id: str, holder: str) -> None:
        was_mine = lease_id in self.live and self.live[lease_id][0] == holder
        try:
            released = self.run(self.service.release(lease_id, holder))
        except NotTheHolder:
            assert self._held_by_another(lease_id, holder)
            return
        assert released == was_mine
        if was_mine:
            del self.live[lease_id]
            self.ended.add(lease_id)
        # Idempotent: a second release changes nothing and says so.
        try:
            assert self.run(self.service.release(lease_id, holder)) is False
        except NotTheHolder:
            assert self._held_by_another(lease_id, holder)

    @rule(run=st.sampled_from(RUNS), holder=st.sampled_from(HOLDERS))
    def release_run(self, run: str, holder: str) -> None:
        released = set(self.run(self.service.release_run(run, holder)))
        expected = {i for i, (h, r, _) in self.live.items() if h == holder and r == run}
        assert released == expected
        for lease_id in released:
            del self.live[lease_id]
            self.ended.add(lease_id)

    # -- what must always hold -----------------------------------------------------------------

    @invariant()
    def a_sandbox_is_never_leased_twice(self) -> None:
        assert len(self.granted_ever) == len(set(self.granted_ever))

    @invariant()
    def the_service_lists_exactly_the_live_leases(self) -> None:
        listed = {lease.id: lease.holder for lease, _ in self.service.leases()}
        assert listed == {i: h for i, (h, _, _) in self.live.items()}

    @invariant()
    def every_live_lease_is_on_its_sandbox(self) -> None:
        for lease_id, (holder, _, expires_at) in self.live.items():
            sandbox = self.backend.items[lease_id]
            assert sandbox.state == api.LEASE_LEASED
            assert sandbox.lease is not None
            assert sandbox.lease.holder == holder
            assert sandbox.lease.expires_at == pytest.approx(expires_at)

    @precondition(lambda self: not self.service.queues.background)
    @invariant()
    def no_claim_is_left_behind(self) -> None:
        # Nothing waits after a step: every acquire has ended in leases or an error.
        assert self.service.waiting("python") == 0


def multiple(*values: str) -> Any:
    from hypothesis.stateful import multiple as _multiple

    return _multiple(*values)


LeaseMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestLeaseMachine = LeaseMachine.TestCase
