"""The sandbox agent crashes inside a leased sandbox: the holder is told clearly and the sandbox replaced.

Bounded: about 20 s (the crash, the holder's next call, its release, the pool refilled).
"""

from __future__ import annotations

import time

import pytest

from tests.integration.faults.conftest import Run
from tests.support.kube import wait_until

pytestmark = pytest.mark.cluster


def test_agent_crash_is_a_clear_error_and_the_sandbox_is_replaced(steady: Run) -> None:
    fleet = steady.fleet
    assert fleet.kubelet is not None
    assert fleet.recorder is not None
    (held,) = steady.load.hold(1)
    wait_until(lambda: sum(c.ok for c in held.calls) >= 3, 20, "the holder to use its sandbox")
    loss = fleet.kubelet.kill_agent(held.pod)

    wait_until(lambda: held.first_lease_error is not None, 20, "the holder to be told", 0.1)
    error = held.first_lease_error
    assert error is not None
    assert error.status == 502, error
    assert error.code == "sandbox_lost", error
    assert "release this lease" in error.detail
    assert error.ended - loss.at < 10, "the holder waited too long to hear"
    steady.load.release_holders()

    def replaced() -> bool:
        return any(p.name == held.pod and p.gone_at is not None for p in fleet.recorder.snapshot())  # type: ignore[union-attr]

    wait_until(replaced, 30, "the crashed sandbox to be deleted", 0.2)
    time.sleep(0.5)
    steady.finish()
