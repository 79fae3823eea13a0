"""The operator fills pools across regions on the real local cluster, and keeps them filled."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.controller.conftest import (
    IMAGE,
    OperatorProcess,
    PodCounter,
    condition,
    live_pods,
    pool_manifest,
    region_counts,
    status,
    wait_ready,
)
from tests.support.kube import Kubectl, wait_until

pytestmark = pytest.mark.cluster

REGIONS = ("us-east1", "europe-west4", "asia-southeast1")


def region_status(kube: Kubectl, pool: str) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in status(kube, pool).get("regions") or ()}


def test_fills_every_region_to_its_weighted_target_across_zones(
    kube: Kubectl, start_operator: Callable[[], OperatorProcess]
) -> None:
    operator = start_operator()
    kube.apply(pool_manifest("python", 16))
    wait_ready(kube, "python", operator)

    items = live_pods(kube, "python")
    assert region_counts(items) == {"us-east1": 8, "europe-west4": 4, "asia-southeast1": 4}
    pod = items[0]
    assert pod["spec"]["runtimeClassName"] == "gvisor"
    assert pod["spec"]["containers"][0]["image"] == IMAGE
    # The pool keeps its leases in the ledger (the default): the Pod names its shard, and its own
    # lease-state label says only "look in the ledger" (never free to a reader without it).
    assert pod["metadata"]["labels"]["sandfleet.dev/lease-state"] == "ledger"
    assert pod["metadata"]["labels"]["sandfleet.dev/shard"].isdigit()
    assert pod["metadata"]["labels"]["sandfleet.dev/template-hash"]
    owner = pod["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("SandboxPool", "python", True)
    us_zones = {
        p["spec"]["nodeSelector"]["topology.kubernetes.io/zone"]
        for p in items
        if p["metadata"]["labels"]["sandfleet.dev/region"] == "us-east1"
    }
    assert us_zones == {"us-east1-b", "us-east1-c"}, "a region's sandboxes spread over its zones"

    found = status(kube, "python")
    assert (found["ready"], found["replicas"], found["leased"]) == (16, 16, 0)
    assert found["selector"] == "sandfleet.dev/pool=python"
    assert found["regionSummary"] == "us-east1 8/8, europe-west4 4/4, asia-southeast1 4/4"
    assert all(r["capacity"] > 0 for r in found["regions"])

    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5) as response:
        metrics = response.read().decode()
    warm = 'sandfleet_sandboxes{cluster="default",pool="python",region="us-east1",state="warm"} 8.0'
    assert warm in metrics
    assert 'sandfleet_sandbox_startup_seconds_count{cluster="default",phase="total",pool="python"' in metrics
    assert "sandfleet_operator_reconciles_total" in metrics


def test_a_deleted_sandbox_is_replaced(kube: Kubectl, start_operator: Callable[[], OperatorProcess]) -> None:
    operator = start_operator()
    kube.apply(pool_manifest("python", 6))
    wait_ready(kube, "python", operator)
    victim = live_pods(kube, "python")[0]["metadata"]["name"]
    kube("delete", "pod", victim, "--wait=false")

    def replaced() -> bool:
        names = {p["metadata"]["name"] for p in live_pods(kube, "python")}
        return len(names) == 6 and victim not in names

    wait_until(replaced, timeout=60, what="the deleted sandbox to be replaced")
    wait_ready(kube, "python", operator)


def _asia_nodes(kubectl: Kubectl) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = kubectl.json(
        "get", "nodes", "-l", "topology.kubernetes.io/region=asia-southeast1,!nvidia.com/gpu.present"
    )["items"]
    return nodes


def _filler(node: dict[str, Any], cpu_millis: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"filler-{node['metadata']['name']}", "labels": {"app": "filler"}},
        "spec": {
            "nodeName": node["metadata"]["name"],
            "containers": [
                {"name": "fill", "image": "filler:1", "resources": {"requests": {"cpu": f"{cpu_millis}m"}}}
            ],
        },
    }


def test_a_region_without_capacity_shifts_its_share_and_takes_it_back(
    kube: Kubectl, kubectl: Kubectl, start_operator: Callable[[], OperatorProcess]
) -> None:
    # Fill asia's nodes so each has room for one 1-CPU sandbox: asia can take 4 of its 10.
    nodes = _asia_nodes(kubectl)
    kube.apply([_filler(n, int(n["status"]["allocatable"]["cpu"]) * 1000 - 1500) for n in nodes])
    operator = start_operator()
    regions = [{"name": r} for r in REGIONS]
    kube.apply(
        pool_manifest(
            "heavy",
            30,
            regions=regions,
            template={"resources": {"requests": {"cpu": "1", "memory": "256Mi"}}},
        )
    )
    wait_ready(kube, "heavy", operator)
    targets = {name: r["target"] for name, r in region_status(kube, "heavy").items()}
    assert targets["asia-southeast1"] <= len(nodes) < 10
    assert sum(targets.values()) == 30, "the shortfall moved to the other regions"
    limited = condition(kube, "heavy", "CapacityLimited")
    assert (limited["status"], limited["reason"]) == ("True", "ShiftedToOtherRegions")
    events = kube.json("get", "events", "--field-selector", "involvedObject.name=heavy")["items"]
    assert any(e["reason"] == "ShiftedToOtherRegions" for e in events)

    kube("delete", "pod", "-l", "app=filler", "--wait=false")

    def shifted_back() -> bool:
        return region_status(kube, "heavy").get("asia-southeast1", {}).get("target") == 10

    wait_until(shifted_back, timeout=60, what="asia's share to come back with its capacity")
    wait_ready(kube, "heavy", operator)
    assert region_counts(live_pods(kube, "heavy")) == dict.fromkeys(REGIONS, 10)
    assert condition(kube, "heavy", "CapacityLimited")["status"] == "False"


NOT_READY = "node-not-ready.stage.kwok.x-k8s.io"


def test_all_nodes_of_a_region_not_ready_moves_its_share(
    kube: Kubectl, kubectl: Kubectl, start_operator: Callable[[], OperatorProcess]
) -> None:
    operator = start_operator()
    regions = [{"name": r} for r in REGIONS]
    kube.apply(pool_manifest("python", 9, regions=regions))
    wait_ready(kube, "python", operator)
    names = [n["metadata"]["name"] for n in _asia_nodes(kubectl)]
    try:
        kubectl("label", "node", *names, f"{NOT_READY}=true", "--overwrite")

        def moved() -> bool:
            counts = region_counts(live_pods(kube, "python"))
            regions_now = region_status(kube, "python")
            return (
                regions_now.get("asia-southeast1", {}).get("target") == 0
                and counts.get("asia-southeast1", 0) == 0
                and counts.get("us-east1", 0) + counts.get("europe-west4", 0) == 9
            )

        wait_until(moved, timeout=90, what="asia's sandboxes to move to the other regions")
        wait_ready(kube, "python", operator)
    finally:
        kubectl("label", "node", *names, f"{NOT_READY}-")
        kubectl("wait", "--for=condition=Ready", "node", *names, "--timeout=60s", timeout=70)

    def back() -> bool:
        return region_counts(live_pods(kube, "python")).get("asia-southeast1", 0) == 3

    wait_until(back, timeout=90, what="asia to take its share back once its nodes are Ready")


def test_an_image_that_never_gets_ready_degrades_the_pool_without_churn(
    kube: Kubectl,
    kubectl: Kubectl,
    namespace: str,
    start_operator: Callable[[], OperatorProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # kwok makes every scheduled Pod Ready; a RuntimeClass that only fits nodes that do not exist
    # stands in for an image that never starts: its sandboxes are never Ready.
    broken = f"broken-{namespace}"
    kubectl.apply(
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": broken},
            "handler": "runsc",
            "scheduling": {"nodeSelector": {"sandfleet.dev/no-such-node": "true"}},
        }
    )
    # The operator gives Pods only to the RuntimeClasses it is told to allow.
    monkeypatch.setenv("SANDFLEET_OPERATOR_RUNTIME_CLASSES", f"gvisor,{broken}")
    try:
        operator = start_operator()
        kube.apply(
            pool_manifest(
                "broken",
                3,
                regions=[{"name": "us-east1"}],
                template={"runtimeClassName": broken, "readinessDeadlineSeconds": 5},
            )
        )
        with PodCounter(kube, "broken") as counter:

            def degraded() -> bool:
                return condition(kube, "broken", "Degraded").get("status") == "True"

            wait_until(degraded, timeout=60, what="the pool to report Degraded=True")
            seen_when_degraded = len(counter.names)
            wait_until(lambda: len(counter.samples) > 100, timeout=60, what="30s of samples")
        found = condition(kube, "broken", "Degraded")
        assert found["reason"] == "SandboxesNotReady"
        assert "not Ready within 5s" in found["message"]
        # Backing off, it replaces one sandbox at a time, 10s, 20s, ... apart: no storm.
        assert len(counter.names) - seen_when_degraded <= 4, (len(counter.names), seen_when_degraded)
        assert counter.peak <= 3
        events = kube.json("get", "events", "--field-selector", "involvedObject.name=broken")["items"]
        assert [e["reason"] for e in events].count("SandboxesNotReady") == 1, operator.log()
    finally:
        kubectl("delete", "runtimeclass", broken, "--wait=false")


def test_creates_refused_for_a_while_back_off_per_pass_and_fill_once_allowed(
    kube: Kubectl, start_operator: Callable[[], OperatorProcess]
) -> None:
    # A fresh namespace refuses Pods (403) until its ServiceAccount exists; a quota of zero Pods
    # stands in for that. Counted once per refused Pod, 20 refusals meant the longest backoff, and
    # the pool sat empty for 5 minutes after the cause had gone (a fault test's 1,000-Pod pool did).
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-pods"}}
    kube.apply({**quota, "spec": {"hard": {"pods": "0"}}})
    operator = start_operator()
    kube.apply(pool_manifest("refused", 20))

    def refused() -> bool:
        # Raised once a whole pass of creates has been refused (operator.log() is only its tail).
        events = kube.json("get", "events", "--field-selector", "involvedObject.name=refused")["items"]
        return any(e["reason"] == "CreateFailed" and "403" in e["message"] for e in events)

    wait_until(refused, timeout=60, what="the operator's creates to be refused")

    def degraded_by_refusal() -> bool:
        found = condition(kube, "refused", "Degraded")
        return found.get("reason") == "CreatesRefused" and "forbidden" in found.get("message", "")

    # After three refused passes the pool is Degraded, quoting the apiserver, not "not Ready within".
    wait_until(degraded_by_refusal, timeout=60, what="Degraded: CreatesRefused, with the apiserver's words")
    kube("delete", "resourcequota", "no-pods")
    lifted = time.monotonic()
    # Refused passes back off 10 s, 20 s, ... (one probe at a time while Degraded), never 5 minutes.
    wait_ready(kube, "refused", operator, timeout=75)
    print(f"filled {time.monotonic() - lifted:.1f}s after the quota went")
    events = kube.json("get", "events", "--field-selector", "involvedObject.name=refused")["items"]
    assert [e["reason"] for e in events].count("CreateFailed") == 1, "one event, not one per Pod"


def test_deleting_the_pool_deletes_its_sandboxes(
    kube: Kubectl, start_operator: Callable[[], OperatorProcess]
) -> None:
    operator = start_operator()
    kube.apply(pool_manifest("python", 6))
    wait_ready(kube, "python", operator)
    kube("delete", "sandboxpool", "python", "--wait=true", "--timeout=30s")
    wait_until(lambda: not live_pods(kube, "python"), timeout=60, what="the pool's sandboxes to be deleted")


def test_scale_subresource_moves_the_target(
    kube: Kubectl, start_operator: Callable[[], OperatorProcess]
) -> None:
    operator = start_operator()
    kube.apply(pool_manifest("python", 4))
    wait_ready(kube, "python", operator)
    kube("scale", "sandboxpool", "python", "--replicas=8")
    wait_until(lambda: status(kube, "python").get("replicas") == 8, timeout=60, what="/scale to reach 8")
    scale = json.loads(
        kube(
            "get",
            "--raw",
            f"/apis/sandfleet.dev/v1alpha1/namespaces/{kube.namespace}/sandboxpools/python/scale",
        )
    )
    assert scale["status"] == {"replicas": 8, "selector": "sandfleet.dev/pool=python"}
    assert len(live_pods(kube, "python")) == 8
