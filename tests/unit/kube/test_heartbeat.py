"""The one Lease heartbeat against an in-memory apiserver: what it writes, when it holds, how it beats."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from sandfleet.core.coordination import first_hold, renewal
from sandfleet.kube.errors import KubeError
from sandfleet.kube.heartbeat import ContendedLease, LeaseHeartbeat, OwnLease
from tests.unit.kube.fake_leases import NAMESPACE, FakeLeases

WALL = 1795953600.0  # 2026-11-29T12:00:00Z
LABELS = {"sandfleet.dev/gateway-member": "true"}


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def contender(leases: FakeLeases, identity: str, clock: Clock, **options: Any) -> ContendedLease:
    return ContendedLease(
        leases,  # type: ignore[arg-type]
        NAMESPACE,
        "sandfleet-operator",
        identity,
        what="leader election",
        clock=clock,
        wall_clock=lambda: WALL + clock.now,
        **options,
    )


def own(leases: FakeLeases, identity: str, **options: Any) -> OwnLease:
    return OwnLease(
        leases,  # type: ignore[arg-type]
        NAMESPACE,
        f"sandfleet-gateway-{identity}",
        identity,
        labels=LABELS,
        what=f"gateway membership: cannot renew sandfleet-gateway-{identity}",
        wall_clock=lambda: WALL,
        **options,
    )


# -- a Lease several replicas contend for ---------------------------------------------------------


async def test_the_first_holder_creates_the_lease_then_renews_it_in_place() -> None:
    leases, clock = FakeLeases(), Clock()
    lease = contender(leases, "op-a", clock, lease_seconds=15.0)
    await lease.beat()
    assert lease.held
    assert leases.objects["sandfleet-operator"] == {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "sandfleet-operator", "resourceVersion": "1"},
        "spec": first_hold("op-a", 15.0, WALL + 1000.0),
    }
    clock.now += 5
    await lease.beat()
    spec = leases.objects["sandfleet-operator"]["spec"]
    assert spec == {**first_hold("op-a", 15.0, WALL + 1000.0), **renewal("op-a", 15.0, WALL + 1005.0)}
    assert leases.calls == [
        ("GET", "sandfleet-operator"),
        ("POST", ""),
        ("GET", "sandfleet-operator"),
        ("PUT", "sandfleet-operator"),
    ]


async def test_a_holder_counts_itself_the_holder_for_eight_tenths_of_its_duration_after_a_write() -> None:
    leases, clock = FakeLeases(), Clock()
    lease = contender(leases, "op-a", clock, lease_seconds=10.0)
    await lease.beat()
    clock.now += 7.99
    assert lease.held
    clock.now += 0.02
    assert not lease.held  # stepped down before anybody else may take it over (10 s of silence)


async def test_another_replica_takes_over_only_after_a_whole_duration_of_silence_by_its_own_clock() -> None:
    leases, clock_a, clock_b = FakeLeases(), Clock(), Clock(50_000.0)  # clocks far apart
    a, b = contender(leases, "op-a", clock_a), contender(leases, "op-b", clock_b)
    await a.beat()
    await b.beat()
    assert not b.held
    clock_b.now += 14.0
    await a.beat()  # a renewal: b's count starts again
    clock_b.now += 14.0
    await b.beat()
    assert not b.held
    assert leases.holder("sandfleet-operator") == "op-a"
    clock_b.now += 15.5  # silent for more than leaseDurationSeconds (15) by b's clock
    await b.beat()
    assert b.held
    spec = leases.objects["sandfleet-operator"]["spec"]
    assert spec["holderIdentity"] == "op-b"
    assert spec["leaseTransitions"] == 1
    assert spec["acquireTime"] == spec["renewTime"]
    # The old holder reads who holds it now and steps down at once.
    await a.beat()
    assert not a.held


async def test_of_two_replicas_racing_for_a_free_lease_exactly_one_holds_it() -> None:
    leases = FakeLeases()
    leases.put_lease("sandfleet-operator", {"holderIdentity": "", "leaseDurationSeconds": 1})
    a, b = contender(leases, "op-a", Clock()), contender(leases, "op-b", Clock())
    await asyncio.gather(a.beat(), b.beat())  # both read it free; the second write is a 409
    assert [a.held, b.held].count(True) == 1
    assert leases.holder("sandfleet-operator") == ("op-a" if a.held else "op-b")


async def test_a_released_lease_is_handed_back_and_another_takes_it_at_once() -> None:
    leases = FakeLeases()
    a, b = contender(leases, "op-a", Clock()), contender(leases, "op-b", Clock())
    await a.beat()
    await b.beat()
    await a.release()
    assert not a.held
    spec = leases.objects["sandfleet-operator"]["spec"]
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"]) == ("", 1)
    await b.beat()
    assert b.held
    await a.release()  # no longer held: nothing is written
    assert leases.holder("sandfleet-operator") == "op-b"


# -- a Lease of one's own ------------------------------------------------------------------------


async def test_an_own_lease_is_created_with_its_labels_then_merge_patched() -> None:
    leases = FakeLeases()
    lease = own(leases, "gw-a", lease_seconds=15.0)
    await lease.beat()
    assert leases.objects["sandfleet-gateway-gw-a"] == {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "sandfleet-gateway-gw-a", "labels": LABELS, "resourceVersion": "1"},
        "spec": renewal("gw-a", 15.0, WALL),
    }
    await lease.beat()
    assert leases.calls == [
        ("PATCH", "sandfleet-gateway-gw-a"),
        ("POST", ""),
        ("PATCH", "sandfleet-gateway-gw-a"),
    ]
    assert leases.objects["sandfleet-gateway-gw-a"]["metadata"]["labels"] == LABELS


async def test_an_own_lease_is_deleted_on_release_and_a_peers_on_forget() -> None:
    leases = FakeLeases()
    a, b = own(leases, "gw-a"), own(leases, "gw-b")
    await a.beat()
    await b.beat()
    await a.forget("sandfleet-gateway-gw-b")
    await a.release()
    assert leases.objects == {}
    with pytest.raises(KubeError) as gone:
        await a.forget("sandfleet-gateway-gw-b")
    assert gone.value.status == 404


# -- the timer ------------------------------------------------------------------------------------


async def _run_for(lease: LeaseHeartbeat, seconds: float, **hooks: Any) -> None:
    task = asyncio.create_task(lease.run(**hooks))
    await asyncio.sleep(seconds)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_failed_beat_is_logged_and_the_next_one_tries_again(caplog: pytest.LogCaptureFixture) -> None:
    leases = FakeLeases()
    lease = own(leases, "gw-a", renew_seconds=0.005)
    after: list[bool] = []
    then: list[str] = []

    async def housekeeping() -> None:
        then.append(leases.holder("sandfleet-gateway-gw-a"))

    leases.failing = KubeError(500, "etcd is down")
    with caplog.at_level(logging.WARNING):
        await _run_for(lease, 0.03, then=housekeeping, after=after.append)
    assert then == [], "nothing more on a beat that wrote nothing"
    assert len(after) >= 2
    assert not any(after)
    warnings = {r.getMessage() for r in caplog.records}
    assert warnings == {"gateway membership: cannot renew sandfleet-gateway-gw-a: 500: etcd is down"}

    leases.failing = ValueError("a bug")  # not a failure of the apiserver: logged as unexpected, beats go on
    caplog.clear()
    await _run_for(lease, 0.02)
    assert {r.getMessage() for r in caplog.records} == {
        "gateway membership: cannot renew sandfleet-gateway-gw-a: unexpected ValueError('a bug')"
    }

    leases.failing = None
    await _run_for(lease, 0.03, then=housekeeping, after=after.append)
    assert then
    assert set(then) == {"gw-a"}
    assert after[-1] is True


async def test_a_replica_that_does_not_hold_the_lease_tries_again_every_standby_interval() -> None:
    leases, clock = FakeLeases(), Clock()
    a = contender(leases, "op-a", clock, renew_seconds=10.0, standby_seconds=0.001)
    b = contender(leases, "op-b", clock, renew_seconds=10.0, standby_seconds=0.001)
    await _run_for(a, 0.02)
    assert leases.calls.count(("GET", "sandfleet-operator")) == 1, "held: the next beat is 10 s away"
    leases.calls.clear()
    await _run_for(b, 0.05)  # a's Lease is live by b's (unmoving) clock: b keeps trying
    assert leases.calls.count(("GET", "sandfleet-operator")) >= 5
    assert not b.held
    assert leases.holder("sandfleet-operator") == "op-a"
