from __future__ import annotations

from typing import Any

import pytest

from sandfleet.core import api
from sandfleet.core.agent_tokens import AGENT_TOKEN_ENV
from sandfleet.core.model import (
    PREWARM_LABEL,
    PoolSpec,
    RegionSpec,
    Template,
    image_key,
    pool_from_object,
    prewarm_from_object,
)
from sandfleet.core.pods import (
    AGENT_BUNDLE_BUSYBOX,
    AGENT_BUNDLE_LAUNCHER,
    AGENT_BUNDLE_MOUNT,
    AGENT_BUNDLE_SIZE_LIMIT,
    AGENT_BUNDLE_VOLUME,
    AgentBundleImage,
    image_digest,
    node_from_object,
    pod_usage,
    ready_replicas,
    replica_selector,
    sandbox_from_pod,
    sandbox_pod,
    sandbox_security_context,
    startup_phases,
)
from sandfleet.core.resources import Resources
from sandfleet.local.injection import MOUNT_POINT

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
    assert broken.broken_reason == "ImagePullBackOff"
    # The agent bundle's init container counts too, with the kubelet's message.
    message = 'failed to pull and unpack image "r/bundle:1":  401 Unauthorized'
    init = _ready_pod(
        initContainerStatuses=[{"state": {"waiting": {"reason": "ErrImagePull", "message": message}}}]
    )
    bundle = sandbox_from_pod(init)
    assert bundle is not None
    assert bundle.broken
    assert (
        bundle.broken_reason == 'ErrImagePull: failed to pull and unpack image "r/bundle:1": 401 Unauthorized'
    )
    healthy = sandbox_from_pod(_ready_pod())
    assert healthy is not None
    assert (healthy.broken, healthy.broken_reason) == (False, "")
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


BUNDLE = AgentBundleImage("localhost/sandfleet/agent-bundle:0.1.0", "Never")


def _pool_with(**template: Any) -> PoolSpec:
    body = {**POOL_OBJECT, "spec": {**POOL_OBJECT["spec"]}}
    body["spec"]["template"] = {**POOL_OBJECT["spec"]["template"], **template}
    return pool_from_object(body)


def _pod_of(pool: PoolSpec, bundle: AgentBundleImage | None = BUNDLE) -> dict[str, Any]:
    return sandbox_pod(pool, pool.template, name="p-1", region="us-east1", zone=None, agent_bundle=bundle)


def test_the_agent_is_the_images_own_unless_the_pool_says_injected() -> None:
    pool = pool_from_object(POOL_OBJECT)
    assert pool.template.agent == api.AGENT_IMAGE
    spec = _pod_of(pool)["spec"]
    # As before the field: the image's entrypoint, no init container, no volume.
    assert {"initContainers", "volumes"}.isdisjoint(spec)
    assert {"command", "args", "volumeMounts"}.isdisjoint(spec["containers"][0])


def test_an_injected_agent_is_copied_in_by_an_init_container_and_mounted_read_only() -> None:
    pool = _pool_with(image="registry.example/tasks/any:1", agent="injected")
    spec = _pod_of(pool)["spec"]
    (copier,) = spec["initContainers"]
    (sandbox,) = spec["containers"]
    (volume,) = spec["volumes"]
    assert volume == {"name": AGENT_BUNDLE_VOLUME, "emptyDir": {"sizeLimit": AGENT_BUNDLE_SIZE_LIMIT}}
    assert (copier["image"], copier["imagePullPolicy"]) == (BUNDLE.image, "Never")
    assert copier["command"][:3] == [AGENT_BUNDLE_BUSYBOX, "cp", "-R"]
    assert copier["volumeMounts"] == [{"name": AGENT_BUNDLE_VOLUME, "mountPath": copier["command"][-1]}]
    # The sandbox sees the bundle read-only, where the local runtime mounts it.
    assert sandbox["volumeMounts"] == [
        {"name": AGENT_BUNDLE_VOLUME, "mountPath": MOUNT_POINT, "readOnly": True}
    ]
    assert sandbox["image"] == "registry.example/tasks/any:1"
    assert sandbox["command"] == [AGENT_BUNDLE_BUSYBOX, "sh", AGENT_BUNDLE_LAUNCHER]
    assert all(path.startswith(f"{MOUNT_POINT}/") for path in sandbox["command"][::2])
    args = sandbox["args"]
    assert args[:2] == ["--port", "8000"]
    # Everything about the image is learnt inside the sandbox: the operator never pulls it.
    for flag in ("--root", "--exec-user", "--verifier-user", "--image-env"):
        assert args[args.index(flag) + 1] == "auto", flag
    # The sandbox keeps its hardening; the copier gets none of its capabilities.
    assert sandbox["securityContext"] == sandbox_security_context()
    assert copier["securityContext"]["runAsNonRoot"] is True
    assert copier["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert copier["securityContext"]["readOnlyRootFilesystem"] is True
    assert copier["securityContext"]["allowPrivilegeEscalation"] is False
    # The copier asks for what the sandbox asks: the Pod reserves no more than before.
    assert copier["resources"] == sandbox["resources"]
    usage = pod_usage({**_pod_of(pool), "spec": {**spec, "nodeName": "n1"}})
    plain = _pod_of(_pool_with(image="registry.example/tasks/any:1"))
    assert usage == pod_usage({**plain, "spec": {**plain["spec"], "nodeName": "n1"}})


def test_an_injected_pool_keeps_the_agents_token_and_the_readiness_probe() -> None:
    pool = _pool_with(agent="injected")
    sandbox = sandbox_pod(
        pool,
        pool.template,
        name="p-1",
        region="us-east1",
        zone=None,
        agent_key=b"k" * 32,
        agent_bundle=BUNDLE,
    )["spec"]["containers"][0]
    assert AGENT_TOKEN_ENV in {e["name"] for e in sandbox["env"]}
    assert sandbox["readinessProbe"]["httpGet"] == {"path": "/v1/ready", "port": 8000}


def test_an_injected_pool_without_a_bundle_image_is_refused() -> None:
    with pytest.raises(ValueError, match="agent bundle"):
        _pod_of(_pool_with(agent="injected"), bundle=None)


def test_the_agent_mode_rolls_the_pods_only_when_it_is_not_the_default() -> None:
    plain = pool_from_object(POOL_OBJECT).template
    assert _pool_with(agent="image").template.hash == plain.hash
    assert _pool_with(agent="injected").template.hash != plain.hash


def test_image_pull_secrets_reach_the_pod_and_roll_it() -> None:
    plain = pool_from_object(POOL_OBJECT)
    assert "imagePullSecrets" not in _pod_of(plain)["spec"]
    pool = _pool_with(imagePullSecrets=[{"name": "registry"}, {"name": "mirror"}], agent="injected")
    assert pool.template.image_pull_secrets == ("registry", "mirror")
    # Pod-wide: the sandbox image and the agent bundle image are pulled with them.
    assert _pod_of(pool)["spec"]["imagePullSecrets"] == [{"name": "registry"}, {"name": "mirror"}]
    assert _pool_with(imagePullSecrets=[{"name": "registry"}]).template.hash != plain.template.hash
    assert _pool_with(imagePullSecrets=[]).template.hash == plain.template.hash


def test_the_bundle_mount_is_the_local_runtimes() -> None:
    assert AGENT_BUNDLE_MOUNT == MOUNT_POINT


def test_commands_as_the_images_user_are_resolved_by_the_agent_inside_the_sandbox() -> None:
    pool = _pool_with(agent="injected", commandsUser="root")
    args = _pod_of(pool)["spec"]["containers"][0]["args"]
    assert args[args.index("--exec-user") + 1] == "image:root"
    assert args[args.index("--verifier-user") + 1] == "auto"  # still an id the image does not name
    assert pool.template.commands_user == "root"
    # The setting is part of the template: a pool that changes it gets new sandboxes.
    assert pool.template.hash != _pool_with(agent="injected").template.hash
