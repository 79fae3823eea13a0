"""A client that vanishes without releasing: its lease expires at the TTL and the Pod is reaped.

Bounded: about 25 s (a 4 s TTL, one operator tick, the pool back at its target).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.faults.conftest import POOL, REAP_SECONDS, TOKEN, Run
from tests.support.kube import wait_until

pytestmark = pytest.mark.cluster

VANISHING_CLIENT = """
import json, sys, time
from sandfleet.client import Fleet
with Fleet(sys.argv[1], token=sys.argv[2], timeout=30) as fleet:
    (lease,) = fleet.acquire(sys.argv[3], ttl_seconds=4, wait_seconds=20, labels={"run": "vanishing"})
    fleet.lease  # noqa: B018
    print(json.dumps({"id": lease.id, "sandbox": lease.sandbox, "expires_at": lease.expires_at}), flush=True)
    time.sleep(600)
"""


def test_a_vanished_clients_lease_expires_and_its_sandbox_is_reaped(steady: Run) -> None:
    fleet = steady.fleet
    client = subprocess.Popen(
        [sys.executable, "-c", VANISHING_CLIENT, fleet.urls[0], TOKEN, POOL],
        stdout=subprocess.PIPE, env=fleet.env,
    )  # fmt: skip
    try:
        assert client.stdout is not None
        line = client.stdout.readline()
        assert line, "the vanishing client got no lease"
        lease = json.loads(line)
    finally:
        client.kill()  # gone without a word: no release, no renew
        client.wait(timeout=10)

    assert fleet.recorder is not None
    recorder = fleet.recorder

    def reaped() -> bool:
        # The recorder's watch is the truth the assertions read; kubectl can see the deletion first.
        return any(p.name == lease["sandbox"] and p.gone_at is not None for p in recorder.snapshot())

    wait_until(reaped, 4 + REAP_SECONDS + 10, "the vanished client's sandbox to be reaped", 0.2)
    (truth,) = [p for p in recorder.snapshot() if p.name == lease["sandbox"]]
    assert truth.gone_at is not None
    assert truth.gone_at - lease["expires_at"] <= REAP_SECONDS, "reaped later than the TTL plus one reconcile"
    assert len(truth.leases) == 1, f"the expired sandbox was handed out again: {truth.leases}"
    steady.finish()
