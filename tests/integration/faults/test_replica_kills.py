"""kill -9 of an operator replica (the leader) and a gateway replica, repeatedly, under load.

Bounded: about 15 s a round; 2 rounds by default, SANDFLEET_FAULT_ROUNDS=N for a longer soak.
"""

from __future__ import annotations

import os
import time
from functools import partial

import pytest

from tests.integration.faults.conftest import Replica, Run
from tests.support.kube import wait_until

pytestmark = pytest.mark.cluster

ROUNDS = int(os.environ.get("SANDFLEET_FAULT_ROUNDS", "2"))


def _episodes_past(run: Run, count: int) -> bool:
    return run.load.stats.episodes >= count


def test_kill_9_operator_and_gateway_replicas_repeatedly(steady: Run) -> None:
    fleet = steady.fleet
    for round_ in range(ROUNDS):
        killed = fleet.leader()
        killed.kill9()
        gateway = fleet.gateways[round_ % len(fleet.gateways)]
        gateway.kill9()
        episodes = steady.load.stats.episodes

        def standby_leads(killed: Replica = killed) -> bool:
            try:
                return fleet.leader() is not killed
            except AssertionError:
                return False

        wait_until(standby_leads, 30, "the standby operator to take over", 0.5)
        # Leases go on through the surviving gateway while the dead one is down.
        wait_until(partial(_episodes_past, steady, episodes + 3), 30, "episodes through the other gateway")
        time.sleep(1.0)
        fleet.ensure_replicas()  # restarted, as a Deployment would
        wait_until(partial(_episodes_past, steady, episodes + 6), 30, "episodes after the restarts")
    assert all(r.kills >= 1 for r in fleet.gateways) or ROUNDS < 2
    steady.finish()
