"""The operator survives restarts and runs as two replicas without duplicating or orphaning sandboxes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.integration.controller.conftest import (
    OperatorProcess,
    PodCounter,
    live_pods,
    pool_manifest,
    wait_ready,
)
from tests.support.kube import Kubectl, wait_until

pytestmark = pytest.mark.cluster


def test_killed_mid_fill_and_restarted_creates_no_duplicates(
    kube: Kubectl, start_operator: Callable[[], OperatorProcess]
) -> None:
    target, stalled_at = 200, 50
    # A Pod quota stalls the first operator part-way, so it is surely killed mid-fill.
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "stall"},
        "spec": {"hard": {"pods": str(stalled_at)}},
    }
    kube.apply(quota)
    wait_until(
        lambda: bool(kube.json("get", "resourcequota", "stall").get("status", {}).get("hard")),
        timeout=30,
        what="the quota to be in force",
    )
    with PodCounter(kube, "python") as counter:
        first = start_operator()
        kube.apply(pool_manifest("python", target))
        wait_until(
            lambda: len(live_pods(kube, "python")) == stalled_at,
            timeout=60,
            what=f"the first operator to create {stalled_at} sandboxes",
        )
        first.kill()
        kube("delete", "resourcequota", "stall")
        second = start_operator()
        wait_ready(kube, "python", second, timeout=240)
        wait_until(lambda: len(counter.samples) > 5, timeout=10, what="a few more samples")
    assert counter.peak == target, f"at most {target} sandboxes at any time, saw {counter.peak}"
    assert len(live_pods(kube, "python")) == target


def test_two_replicas_at_once_never_duplicate_and_the_standby_takes_over(
    kube: Kubectl, start_operator: Callable[[], OperatorProcess]
) -> None:
    target = 60
    with PodCounter(kube, "python") as counter:
        replicas = [start_operator(), start_operator()]
        kube.apply(pool_manifest("python", target))
        wait_ready(kube, "python", replicas[0], timeout=120)
        holder = kube.json("get", "lease", "sandfleet-operator")["spec"]["holderIdentity"]
        leader = next(r for r in replicas if f"-{r.pid}-" in holder)
        standby = next(r for r in replicas if r is not leader)
        leader.kill()
        victims = [p["metadata"]["name"] for p in live_pods(kube, "python")[:5]]
        kube("delete", "pod", *victims, "--wait=false")

        def refilled() -> bool:
            names = {p["metadata"]["name"] for p in live_pods(kube, "python")}
            return len(names) == target and not names & set(victims)

        wait_until(refilled, timeout=60, what="the standby to take over and replace deleted sandboxes")
    assert counter.peak == target, f"two replicas made {counter.peak} sandboxes for a target of {target}"
    assert "acquired leadership" in standby.log()
