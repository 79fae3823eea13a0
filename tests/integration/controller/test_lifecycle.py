"""Leases end, templates change, images are pre-warmed and demand sets the target, on the real cluster."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from sandfleet.core import api
from sandfleet.core.leases import LeaseRecord
from sandfleet.core.model import image_key
from tests.integration.controller.conftest import (
    OperatorProcess,
    live_pods,
    pool_manifest,
    status,
    wait_ready,
)
from tests.support.kube import Kubectl, wait_until
from tests.support.leases import write_lease, write_release

pytestmark = pytest.mark.cluster

ONE_REGION = [{"name": "europe-west4"}]


def lease(kube: Kubectl, name: str, expires_at: float) -> None:
    """What the gateway writes to claim a sandbox, in the store the Pod uses (see tests/support/leases.py)."""
    now = time.time()
    record = LeaseRecord(
        f"{kube.namespace}.{name}", "python", "actor-0", now, expires_at, int(expires_at - now)
    )
    write_lease(kube, name, record)


# The operator reaps and keeps leases the same whichever store a pool writes them to.
STORES = pytest.mark.parametrize("store", [api.STORE_LEDGER, api.STORE_POD])


def names(items: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["name"] for p in items}


@STORES
def test_released_and_expired_leases_are_reaped_and_live_ones_survive_a_shrink(
    kube: Kubectl, start_operator: Callable[[], OperatorProcess], store: str
) -> None:
    operator = start_operator()
    kube.apply(pool_manifest("python", 4, regions=ONE_REGION, lease={"store": store}))
    wait_ready(kube, "python", operator)
    released, expiring, live, *_ = sorted(names(live_pods(kube, "python")))
    lease(kube, live, time.time() + 3600)
    lease(kube, expiring, time.time() + 2)
    lease(kube, released, time.time() + 3600)
    write_release(kube, released)

    def reaped() -> bool:
        now = names(live_pods(kube, "python"))
        return released not in now and expiring not in now and live in now

    wait_until(reaped, timeout=30, what="the released and the expired sandboxes to be deleted")
    # The status is written at most once a second while Pods change: it converges on 4 warm, 1 leased.
    wait_until(
        lambda: (status(kube, "python").get("ready"), status(kube, "python").get("leased")) == (4, 1),
        timeout=60,
        what="the warm pool to refill beside the one live lease",
    )

    kube("scale", "sandboxpool", "python", "--replicas=0")
    wait_until(
        lambda: names(live_pods(kube, "python")) == {live},
        timeout=60,
        what="the warm sandboxes to go and the leased one to stay",
    )


@STORES
def test_template_change_rolls_warm_sandboxes_never_leased_ones(
    kube: Kubectl, start_operator: Callable[[], OperatorProcess], store: str
) -> None:
    operator = start_operator()
    kube.apply(pool_manifest("python", 3, regions=ONE_REGION, lease={"store": store}))
    wait_ready(kube, "python", operator)
    held = sorted(names(live_pods(kube, "python")))[0]
    lease(kube, held, time.time() + 3600)
    wait_until(lambda: status(kube, "python").get("ready") == 3, timeout=60, what="the refill after a lease")
    changed = pool_manifest("python", 3, regions=ONE_REGION, template={"image": "sandfleet/sandbox:0.2.0"})
    kube.apply({**changed, "spec": {**changed["spec"], "lease": {"store": store}}})

    def rolled() -> bool:
        items = live_pods(kube, "python")
        images = {p["metadata"]["name"]: p["spec"]["containers"][0]["image"] for p in items}
        fresh = [n for n, image in images.items() if image == "sandfleet/sandbox:0.2.0"]
        return len(fresh) == 3 and images.get(held) == "sandfleet/sandbox:0.1.0" and len(images) == 4

    wait_until(rolled, timeout=60, what="warm sandboxes on the new image, the leased one untouched")


def test_prewarm_keeps_an_image_warm_for_its_ttl(
    kube: Kubectl, start_operator: Callable[[], OperatorProcess]
) -> None:
    operator = start_operator()
    kube.apply(pool_manifest("swe", 2))
    wait_ready(kube, "swe", operator)
    task_image = "swe-task/django-1234:latest"
    kube.apply(
        {
            "apiVersion": "sandfleet.dev/v1alpha1",
            "kind": "SandboxPrewarm",
            "metadata": {"name": "django-1234"},
            "spec": {"pool": "swe", "image": task_image, "count": 3, "ttlSeconds": 15},
        }
    )

    def task_pods() -> list[dict[str, Any]]:
        return [p for p in live_pods(kube, "swe") if p["spec"]["containers"][0]["image"] == task_image]

    wait_until(lambda: len(task_pods()) == 3, timeout=30, what="3 sandboxes of the task image")
    pod = task_pods()[0]
    assert pod["metadata"]["labels"]["sandfleet.dev/prewarm"] == "true"
    assert pod["metadata"]["labels"]["sandfleet.dev/image-key"] == image_key(task_image)
    wait_until(lambda: not task_pods(), timeout=45, what="the task image's sandboxes to go after the TTL")
    assert len(live_pods(kube, "swe")) == 2, "the pool's own warm sandboxes stay"


def test_autoscaling_overrides_replicas_within_its_bounds(
    kube: Kubectl, start_operator: Callable[[], OperatorProcess]
) -> None:
    operator = start_operator()
    kube.apply(
        pool_manifest(
            "auto", 10, regions=ONE_REGION, autoscaling={"enabled": True, "minReplicas": 3, "maxReplicas": 20}
        )
    )
    # No leases yet: demand is zero, so the floor (not spec.replicas) sets the warm target.
    wait_until(lambda: status(kube, "auto").get("replicas") == 3, timeout=60, what="the autoscaling floor")
    wait_ready(kube, "auto", operator)
    assert len(live_pods(kube, "auto")) == 3


def test_a_fleet_member_keeps_its_share_of_the_warm_target(
    kube: Kubectl, start_operator: Callable[[], OperatorProcess]
) -> None:
    operator = start_operator()
    shared = pool_manifest("member", 10, regions=ONE_REGION)
    shared["metadata"]["annotations"] = {api.FLEET_SHARE_ANNOTATION: "0.3"}  # as a fleet gateway writes it
    kube.apply(shared)
    wait_until(lambda: status(kube, "member").get("replicas") == 3, timeout=60, what="a 0.3 share of 10")
    wait_ready(kube, "member", operator)
    assert len(live_pods(kube, "member")) == 3
    # The other members were lost: the whole target moves here.
    kube("annotate", "--overwrite", "sandboxpool", "member", f"{api.FLEET_SHARE_ANNOTATION}=1")
    wait_until(lambda: status(kube, "member").get("replicas") == 10, timeout=60, what="the whole target")
    wait_ready(kube, "member", operator)
    assert len(live_pods(kube, "member")) == 10
