from __future__ import annotations

from typing import Any

from sandfleet.core import api
from sandfleet.core.model import (
    PREWARM_LABEL,
    RegionSpec,
    Template,
    image_key,
    pool_from_object,
    prewarm_from_object,
)
from sandfleet.core.pods import (
    image_digest,
    node_from_object,
    pod_usage,
    ready_replicas,
    replica_selector,
    sandbox_from_pod,
    sandbox_pod,
    startup_phases,
)
from sandfleet.core.resources import Resources

POOL_OBJECT: dict[str, Any] = {
    "metadata": {"namespace": "ns", "name": "python", "uid": "u-1", "generation": 3},
    "spec": {
        "replicas": 12,
        "regions": [
            {"name": "us-east1", "weight": 2, "minWarm": 2, "maxSandboxes": 200, "zones": ["us-east1-b"]}
        ],
        "template": {
            "image": "sandfleet/sandbox:0.1.0",
            "env": [{"name": "A", "value": "1"}],
            "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "1"}},
            "tolerations": [{"operator": "Exists"}],
            "readinessDeadlineSeconds": 30,
        },
        "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 9},
    },
}


def test_pool_from_object_reads_every_field() -> None:
    pool = pool_from_object(POOL_OBJECT)
    assert pool.key == "ns/python"
    assert pool.generation == 3
    assert pool.replicas == 12
    assert pool.regions == (RegionSpec("us-east1", 2, 2, 200, ("us-east1-b",)),)
    assert pool.template.requests == Resources(250, 256 * 2**20, 1)
    assert pool.template.readiness_deadline_seconds == 30
    assert pool.autoscaling.enabled
    assert pool.autoscaling.max_replicas == 9


def test_template_hash_follows_what_changes_the_pod() -> None:
    template = pool_from_object(POOL_OBJECT).template
    assert template.hash == pool_from_object(POOL_OBJECT).template.hash
    assert template.with_image("other:1").hash != template.hash
    from dataclasses import replace

    assert replace(template, readiness_deadline_seconds=99).hash == template.hash


def test_a_named_service_account_reaches_the_pod_and_rolls_it() -> None:
    plain = pool_from_object(POOL_OBJECT)
    assert plain.template.service_account_name is None
    assert (
        "serviceAccountName"
        not in sandbox_pod(plain, plain.template, name="p-1", region="us-east1", zone=None)["spec"]
    )
    body = {**POOL_OBJECT, "spec": {**POOL_OBJECT["spec"]}}
    body["spec"]["template"] = {**POOL_OBJECT["spec"]["template"], "serviceAccountName": "sandbox"}
    named = pool_from_object(body)
    spec = sandbox_pod(named, named.template, name="p-1", region="us-east1", zone=None)["spec"]
    assert spec["serviceAccountName"] == "sandbox"
    assert spec["automountServiceAccountToken"] is False
    # Naming an account changes the Pod, so it rolls; pools that never name one keep their hash.
    assert named.template.hash != plain.template.hash
    from dataclasses import replace

    assert replace(named.template, service_account_name=None).hash == plain.template.hash


def test_sandbox_pod_round_trips_through_sandbox_from_pod() -> None:
    pool = pool_from_object(POOL_OBJECT)
    pod = sandbox_pod(
        pool, pool.template, name="python-1", region="us-east1", zone="us-east1-b", prewarm=True
    )
    labels = pod["metadata"]["labels"]
    assert labels[api.LEASE_STATE_LABEL] == api.LEASE_FREE
    assert labels[api.IMAGE_KEY_LABEL] == image_key("sandfleet/sandbox:0.1.0")
    assert labels[PREWARM_LABEL] == "true"
    spec = pod["spec"]
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["nodeSelector"] == {api.REGION_LABEL: "us-east1", api.ZONE_LABEL: "us-east1-b"}
    assert spec["automountServiceAccountToken"] is False
    assert spec["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/v1/ready"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    pod["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    sandbox = sandbox_from_pod(pod)
    assert sandbox is not None
    assert (sandbox.region, sandbox.zone, sandbox.template_hash) == (
        "us-east1",
        "us-east1-b",
        pool.template.hash,
    )
    assert sandbox.free
    assert sandbox.prewarm
    assert not sandbox.ready


def _ready_pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {api.MANAGED_BY_LABEL: api.MANAGED_BY, api.POOL_LABEL: "python"},
        },
        "spec": {"nodeName": "n1", "containers": [{"resources": {"requests": {"cpu": "500m"}}}]},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:04Z"},
            ],
            "containerStatuses": [{"state": {"running": {"startedAt": "2026-01-01T00:00:03Z"}}}],
            **status,
        },
    }


def test_a_sandbox_reports_the_digest_its_node_resolved_the_image_to() -> None:
    pool = pool_from_object(POOL_OBJECT)
    pod = sandbox_pod(pool, pool.template, name="python-1", region="us-east1", zone=None)
    assert sandbox_from_pod(pod).image_digest == ""  # type: ignore[union-attr]  # not started yet
    digest = "sha256:" + "ab" * 32
    pod["status"] = {
        "containerStatuses": [
            {"name": "sidecar", "imageID": "docker.io/other@sha256:" + "cd" * 32},
            {"name": api.SANDBOX_CONTAINER, "imageID": f"docker.io/sandfleet/sandbox@{digest}"},
        ]
    }
    sandbox = sandbox_from_pod(pod)
    assert sandbox is not None
    assert (sandbox.image_digest, sandbox.template_hash) == (digest, pool.template.hash)
    assert image_digest(digest) == digest  # containerd may report the bare digest


def test_startup_phases_come_from_the_pods_own_timestamps() -> None:
    assert startup_phases(_ready_pod()) == {"scheduled": 1.0, "started": 2.0, "ready": 1.0, "total": 4.0}


def test_broken_pods_and_usage() -> None:
    pulling = _ready_pod(containerStatuses=[{"state": {"waiting": {"reason": "ImagePullBackOff"}}}])
    broken = sandbox_from_pod(pulling)
    assert broken is not None
    assert broken.broken
    assert pod_usage(_ready_pod()) == ("n1", Resources(500, 0, 1))
    assert pod_usage(_ready_pod(phase="Succeeded")) is None
    assert sandbox_from_pod({"metadata": {"name": "x", "labels": {}}}) is None


def test_node_from_object() -> None:
    node = node_from_object(
        {
            "metadata": {"name": "n", "labels": {api.REGION_LABEL: "us", api.ZONE_LABEL: "us-a"}},
            "spec": {"unschedulable": True, "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {
                "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "False"}],
            },
        }
    )
    assert (node.region, node.zone, node.ready, node.schedulable) == ("us", "us-a", False, False)
    assert node.allocatable == Resources(8000, 32 * 2**30, 110)
    assert node.taints[0].key == "k"


def test_template_default_requests_are_one_pod_slot() -> None:
    assert Template(image="i").requests == Resources(0, 0, 1)


def test_prewarm_expiry_counts_from_the_last_write_unless_expires_at_is_set() -> None:
    body: dict[str, Any] = {
        "metadata": {
            "namespace": "ns",
            "name": "django",
            "creationTimestamp": "1970-01-01T00:01:40Z",
            "managedFields": [{"manager": "gateway", "time": "1970-01-01T00:03:20Z"}],
        },
        "spec": {"pool": "python", "image": "django:1", "count": 3, "ttlSeconds": 60},
    }
    prewarm = prewarm_from_object(body, now=500.0)
    assert (prewarm.pool, prewarm.image, prewarm.count) == ("python", "django:1", 3)
    assert prewarm.expires_at == 200.0 + 60
    body["spec"]["expiresAt"] = "1970-01-01T00:16:40Z"
    assert prewarm_from_object(body, now=500.0).expires_at == 1000.0


REPLICA = {
    "app.kubernetes.io/name": "sandfleet",
    "app.kubernetes.io/instance": "prod",
    "app.kubernetes.io/component": "gateway",
}


def test_replicas_are_selected_by_name_instance_and_component() -> None:
    pod = {"metadata": {"labels": {**REPLICA, "pod-template-hash": "abc"}}}
    assert replica_selector(pod) == (
        "app.kubernetes.io/name=sandfleet,app.kubernetes.io/instance=prod,app.kubernetes.io/component=gateway"
    )
    for missing in REPLICA:
        assert (
            replica_selector({"metadata": {"labels": {k: v for k, v in REPLICA.items() if k != missing}}})
            is None
        )
    assert replica_selector({"metadata": {"labels": {**REPLICA, "app.kubernetes.io/name": ""}}}) is None
    assert replica_selector({"metadata": {}}) is None
    assert replica_selector({}) is None


def _replica(
    name: str, ip: str | None = "10.0.0.2", account: str = "sandfleet-gateway", **changes: Any
) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {"name": name, "labels": dict(REPLICA)},
        "spec": {"serviceAccountName": account},
        "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }
    for where, value in changes.items():
        section, key = where.split("__")
        pod[section][key] = value
    return pod


def test_only_the_other_ready_replicas_of_the_gateways_own_account_are_asked() -> None:
    me, account = "gw-a", "sandfleet-gateway"
    pods = [
        _replica("gw-a", "10.0.0.1"),  # this replica
        _replica("gw-b", "10.0.0.3"),
        _replica("gw-c", "10.0.0.2"),
        _replica("gw-d", "10.0.0.4", account="default"),  # copies the labels, not the account
        _replica("gw-e", "10.0.0.5", metadata__deletionTimestamp="2026-01-01T00:00:00Z"),
        _replica("gw-f", "10.0.0.6", status__phase="Pending"),
        _replica("gw-g", "10.0.0.7", status__conditions=[{"type": "Ready", "status": "False"}]),
        _replica("gw-h", "10.0.0.8", status__conditions=[]),
        _replica("gw-i", None),
        _replica("gw-j", ""),
    ]
    assert ready_replicas(pods, me, account) == ["10.0.0.2", "10.0.0.3"]
    assert ready_replicas([], me, account) == []
    assert ready_replicas([_replica("gw-b")], me, "") == []  # an unknown account matches nobody
