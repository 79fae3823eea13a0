"""The local cluster is a real one: controllers, scheduler, kwok nodes per region, GPUs, TokenReview."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from tests.support.kube import Kubectl, wait_until

pytestmark = pytest.mark.cluster

REGION = "topology.kubernetes.io/region"


def nodes_by_name(kubectl: Kubectl) -> dict[str, dict[str, Any]]:
    return {n["metadata"]["name"]: n for n in kubectl.json("get", "nodes")["items"]}


def test_nodes_span_three_regions_and_two_zones_each(kubectl: Kubectl) -> None:
    zones_by_region: dict[str, set[str]] = {}
    for node in nodes_by_name(kubectl).values():
        labels = node["metadata"]["labels"]
        zones_by_region.setdefault(labels[REGION], set()).add(labels["topology.kubernetes.io/zone"])
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True", node["metadata"]["name"]
    assert len(zones_by_region) == 3
    assert all(len(zones) == 2 for zones in zones_by_region.values())
    cpus = {
        n["metadata"]["labels"][REGION]: n["status"]["allocatable"]["cpu"]
        for n in nodes_by_name(kubectl).values()
        if "nvidia.com/gpu" not in n["status"]["allocatable"]
    }
    assert len(set(cpus.values())) == 3, f"regions should differ in capacity: {cpus}"


def test_deployment_of_50_spreads_over_regions_and_becomes_ready(kube: Kubectl) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 50,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": REGION,
                            "whenUnsatisfiable": "DoNotSchedule",
                            "labelSelector": {"matchLabels": {"app": "web"}},
                        }
                    ],
                    "containers": [
                        {
                            "name": "web",
                            "image": "registry.invalid/web:1",
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                        }
                    ],
                },
            },
        },
    }
    kube.apply(deployment)
    wait_until(
        lambda: kube.json("get", "deployment", "web").get("status", {}).get("readyReplicas") == 50,
        timeout=120,
        what="50 ready replicas",
    )
    nodes = nodes_by_name(kube)
    pods = kube.json("get", "pods", "-l", "app=web")["items"]
    assert len(pods) == 50
    per_region = Counter(nodes[p["spec"]["nodeName"]]["metadata"]["labels"][REGION] for p in pods)
    assert len(per_region) == 3
    assert max(per_region.values()) - min(per_region.values()) <= 1
    assert all(p["status"]["phase"] == "Running" for p in pods)
    # Untolerated GPU taints keep ordinary pods off GPU nodes.
    assert not any("nvidia.com/gpu" in nodes[p["spec"]["nodeName"]]["status"]["allocatable"] for p in pods)


def test_gpu_pod_lands_only_on_a_gpu_node(kube: Kubectl) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "learner"},
        "spec": {
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "learner",
                    "image": "registry.invalid/learner:1",
                    "resources": {"limits": {"nvidia.com/gpu": "2"}},
                }
            ],
        },
    }
    kube.apply(pod)
    wait_until(
        lambda: kube.json("get", "pod", "learner")["status"].get("phase") == "Running",
        timeout=60,
        what="the GPU pod to run",
    )
    node_name = kube.json("get", "pod", "learner")["spec"]["nodeName"]
    node = nodes_by_name(kube)[node_name]
    assert int(node["status"]["allocatable"]["nvidia.com/gpu"]) >= 2

    too_big = json.loads(json.dumps(pod))
    too_big["metadata"]["name"] = "greedy"
    too_big["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "64"
    kube.apply(too_big)
    wait_until(
        lambda: any(
            c.get("reason") == "Unschedulable"
            for c in kube.json("get", "pod", "greedy")["status"].get("conditions", [])
        ),
        timeout=60,
        what="the scheduler to refuse a pod no node can hold",
    )


def test_service_account_token_passes_token_review(kube: Kubectl, namespace: str) -> None:
    kube("create", "serviceaccount", "actor")
    token = kube("create", "token", "actor", "--duration=10m").strip()

    def review(candidate: str) -> dict[str, Any]:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": candidate},
        }
        created = kube("create", "-o", "json", "-f", "-", stdin=json.dumps(body))
        status: dict[str, Any] = json.loads(created)["status"]
        return status

    accepted = review(token)
    assert accepted["authenticated"] is True
    assert accepted["user"]["username"] == f"system:serviceaccount:{namespace}:actor"
    assert f"system:serviceaccounts:{namespace}" in accepted["user"]["groups"]
    assert review(token[:-4] + "AAAA").get("authenticated") is not True


def test_rbac_is_enforced_for_service_accounts(kube: Kubectl, namespace: str) -> None:
    kube("create", "serviceaccount", "nobody")
    allowed = kube.run("auth", "can-i", "list", "pods", f"--as=system:serviceaccount:{namespace}:nobody")
    assert allowed.stdout.strip() == "no"
