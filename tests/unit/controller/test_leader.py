"""Leader election over the Lease heartbeat: one leader at a time, told to the operator, handed on at stop.

How the Lease is taken, renewed and handed back is sandfleet.kube.heartbeat's (tests/unit/kube/
test_heartbeat.py); these are the elector's own parts: its Lease, its cadence, what a change tells.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from prometheus_client import REGISTRY

from sandfleet.controller.leader import LeaderElector
from tests.unit.kube.fake_leases import NAMESPACE, FakeLeases


def elector(leases: FakeLeases, identity: str, renew_seconds: float = 0.005) -> LeaderElector:
    return LeaderElector(
        leases,  # type: ignore[arg-type]
        NAMESPACE,
        "sandfleet-operator",
        identity,
        lease_seconds=15.0,
        renew_seconds=renew_seconds,
    )


def leader_metric() -> float | None:
    return REGISTRY.get_sample_value("sandfleet_operator_leader")


async def stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def until(condition: Callable[[], bool], within: float = 2.0) -> None:
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110 (a property over time, no event to wait on)
            await asyncio.sleep(0.001)


def test_a_replica_that_does_not_lead_tries_every_two_seconds_or_its_renewal_if_sooner() -> None:
    leases = FakeLeases()
    assert elector(leases, "op-a", renew_seconds=5.0).lease.standby_seconds == 2.0
    assert elector(leases, "op-a", renew_seconds=1.0).lease.standby_seconds == 1.0
    assert elector(leases, "op-a", renew_seconds=5.0).lease.renew_seconds == 5.0


async def test_one_replica_leads_and_the_other_takes_over_when_it_steps_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    leases = FakeLeases()
    a, b = elector(leases, "op-a"), elector(leases, "op-b")
    caplog.set_level(logging.INFO, logger="sandfleet.controller.leader")
    run_a = asyncio.create_task(a.run())
    await until(lambda: a.is_leader)
    assert a.changed.is_set()
    assert leader_metric() == 1.0
    run_b = asyncio.create_task(b.run())
    try:
        await asyncio.sleep(0.03)  # b tries again and again, and never leads
        assert a.is_leader
        assert not b.is_leader
        assert not b.changed.is_set()
        # A clean stop (its loop ended first, as Operator.stop does) hands the Lease back.
        await stopped(run_a)
        await a.release()
        assert not a.is_leader
        assert leader_metric() == 0.0
        await until(lambda: b.is_leader)
        assert b.changed.is_set()
    finally:
        await stopped(run_a)
        await stopped(run_b)
    assert leases.holder("sandfleet-operator") == "op-b"
    messages = [r.getMessage() for r in caplog.records]
    assert "acquired leadership (op-a)" in messages
    assert "acquired leadership (op-b)" in messages


async def test_a_stop_without_leading_writes_nothing() -> None:
    leases = FakeLeases()
    leases.put_lease("sandfleet-operator", {"holderIdentity": "op-a", "leaseDurationSeconds": 15})
    b = elector(leases, "op-b")
    await b.lease.beat()
    leases.calls.clear()
    await b.release()
    assert leases.calls == []
    assert leases.holder("sandfleet-operator") == "op-a"
