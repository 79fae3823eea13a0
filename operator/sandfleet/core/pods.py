"""Sandbox Pods as plain dicts: the manifest the operator creates, and the one reading of Pods and Nodes."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from sandfleet.core import api
from sandfleet.core.agent_tokens import AGENT_TOKEN_ENV, agent_token
from sandfleet.core.leases import (
    episodes_from_annotations,
    lease_from_annotations,
    reservation_from_annotations,
)
from sandfleet.core.model import (
    BROKEN_WAITING_REASONS,
    PREWARM_LABEL,
    Node,
    PoolSpec,
    SandboxPod,
    Taint,
    Template,
    image_key,
)
from sandfleet.core.resources import Resources
from sandfleet.core.timestamps import parse_time

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
STARTUP_PHASES = ("scheduled", "started", "ready", "total")
# Spin-up by phase, the same histogram from the operator (Pods) and from `serve --local` (runsc).
STARTUP_METRIC: Final = "sandfleet_sandbox_startup_seconds"
STARTUP_LABELS: Final = ("pool", "region", "phase")
STARTUP_BUCKETS: Final = (0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300)

# The in-sandbox agent runs as uid 0 *inside gVisor* and drops every exec to uid 1000 and the
# verifier to uid 1001: switching uids needs a root supervisor, so the Pod cannot be runAsNonRoot.
# gVisor (runtimeClassName, enforced by the operator and an admission policy) is the boundary; these
# six capabilities are all the agent keeps (all inside the Baseline Pod Security level).
SANDBOX_CAPABILITIES: Final = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID")


def sandbox_security_context() -> dict[str, Any]:
    """The sandbox container's securityContext (a fresh dict: callers may change their copy)."""
    return {
        "runAsUser": 0,
        "runAsNonRoot": False,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": list(SANDBOX_CAPABILITIES)},
        "seccompProfile": {"type": "RuntimeDefault"},
        # Task images bake the repository, its packages and caches into the image, and the episode
        # edits them in place: a read-only root would break every task. The writable layer is
        # bounded by the ephemeral-storage limit instead.
        "readOnlyRootFilesystem": False,
    }


# The injected agent (spec.template.agent: injected). An init container of the agent bundle image
# (sandbox_image/bundle_image.py) copies the bundle into an emptyDir, mounted read-only in the
# sandbox at the local runtime's mount point (sandfleet.local.injection.MOUNT_POINT), and the
# sandbox's process is the bundle's launcher: the image's entrypoint, libc and Python take no part.
# containerd 1.6 has no image volumes, hence the copy (docs/images.md, "Kubernetes").
AGENT_BUNDLE_MOUNT: Final = "/.sandfleet"
AGENT_BUNDLE_VOLUME: Final = "sandfleet-agent"
AGENT_BUNDLE_CONTAINER: Final = "sandfleet-agent-bundle"
# Where the init container sees the volume it fills (its own image has the bundle at the mount point).
AGENT_BUNDLE_TARGET: Final = "/sandfleet-agent"
# The bundle image's static busybox, and the launcher it runs: it moves the image's LD_* variables
# out of the loader's way and starts the bundle's python on the bundle's libraries.
AGENT_BUNDLE_BUSYBOX: Final = f"{AGENT_BUNDLE_MOUNT}/bin/busybox"
AGENT_BUNDLE_LAUNCHER: Final = f"{AGENT_BUNDLE_MOUNT}/bin/agent"
# The bundle is about 48 MB; the volume counts against the Pod's ephemeral storage. On the node's
# disk: a memory-backed one measured no faster (the copier's time goes by files, not bytes, and the
# image ships the stdlib as one zip for that; docs/images.md, "Kubernetes").
AGENT_BUNDLE_SIZE_LIMIT: Final = "128Mi"
# The copier needs no privilege: nobody, on a read-only root, without capabilities.
AGENT_BUNDLE_COPIER_ID: Final = 65534
# The agent learns the image's config inside the sandbox (sandfleet_agent.image_config): the
# kubelet, not sandfleet, has the image. Its users from the image's /etc/passwd and /etc/group, its
# working area from its WorkingDir (the container's cwd), its Env from the container's environment.
INJECTED_AGENT_FLAGS: Final = (
    *("--root", "auto"),
    *("--exec-user", "auto"),
    *("--verifier-user", "auto"),
    *("--image-env", "auto"),
)


@dataclass(frozen=True)
class AgentBundleImage:
    """The image the operator injects the agent from (the chart's sandbox.agentBundle)."""

    image: str
    pull_policy: str = "IfNotPresent"


def bundle_copier_security_context() -> dict[str, Any]:
    """The bundle copier's securityContext: it only reads its image and writes the empty volume."""
    return {
        "runAsUser": AGENT_BUNDLE_COPIER_ID,
        "runAsGroup": AGENT_BUNDLE_COPIER_ID,
        "runAsNonRoot": True,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
        "readOnlyRootFilesystem": True,
    }


def inject_agent(
    spec: dict[str, Any],
    container: dict[str, Any],
    bundle: AgentBundleImage,
    port: int,
    commands_user: str | None = None,
) -> None:
    """Make `container` run the injected agent: the bundle's copier first, the bundle mounted read-only."""
    container["command"] = [AGENT_BUNDLE_BUSYBOX, "sh", AGENT_BUNDLE_LAUNCHER]
    flags = list(INJECTED_AGENT_FLAGS)
    if commands_user is not None:
        # The agent resolves the name by the image's own /etc/passwd (sandfleet_agent/__main__.py).
        flags[flags.index("--exec-user") + 1] = f"image:{commands_user}"
    container["args"] = ["--port", str(port), *flags]
    container["volumeMounts"] = [
        {"name": AGENT_BUNDLE_VOLUME, "mountPath": AGENT_BUNDLE_MOUNT, "readOnly": True}
    ]
    spec["initContainers"] = [
        {
            "name": AGENT_BUNDLE_CONTAINER,
            "image": bundle.image,
            "imagePullPolicy": bundle.pull_policy,
            # The bundle's files as the image has them (modes, links); owned by the copier, and
            # read-only where the sandbox sees them.
            "command": [AGENT_BUNDLE_BUSYBOX, "cp", "-R", f"{AGENT_BUNDLE_MOUNT}/.", AGENT_BUNDLE_TARGET],
            "volumeMounts": [{"name": AGENT_BUNDLE_VOLUME, "mountPath": AGENT_BUNDLE_TARGET}],
            # The sandbox's own: init containers run before it, so the Pod reserves no more (the
            # larger of the two), and a quota that requires limits admits it.
            "resources": {k: dict(v) for k, v in container["resources"].items()},
            "securityContext": bundle_copier_security_context(),
        }
    ]
    spec["volumes"] = [{"name": AGENT_BUNDLE_VOLUME, "emptyDir": {"sizeLimit": AGENT_BUNDLE_SIZE_LIMIT}}]


# Where a recycling pool's agent keeps the pristine copy of its writable roots (root only).
PRISTINE_DIR_ENV: Final = "SANDFLEET_AGENT_PRISTINE_DIR"
PRISTINE_DIR: Final = "/var/lib/sandfleet-agent/pristine"

# What a sandbox may write to its node's disk (writable layer, logs) unless its template says.
DEFAULT_EPHEMERAL_STORAGE: Final[Mapping[str, str]] = {"requests": "256Mi", "limits": "2Gi"}
EPHEMERAL_STORAGE: Final = "ephemeral-storage"


def runtime_class_refusal(template: Template, allowed: Collection[str]) -> str | None:
    """Why a pool's sandboxes may not be created under its runtimeClassName, or None when they may."""
    if template.runtime_class_name in allowed:
        return None
    return (
        f"runtimeClassName {template.runtime_class_name!r} is not one the cluster admin allows for "
        f"sandboxes ({', '.join(sorted(allowed)) or 'none'}): set spec.template.runtimeClassName to one "
        "of them, or ask the admin to add it to the operator's allowed runtime classes"
    )


def _sandbox_resources(template: Template) -> dict[str, dict[str, Any]]:
    """The template's resources with an ephemeral-storage request and limit filled in where missing."""
    resources = {k: dict(v) for k, v in template.resources.items()}
    requests, limits = resources.setdefault("requests", {}), resources.setdefault("limits", {})
    if EPHEMERAL_STORAGE not in limits:
        # A request alone becomes the limit too (never a default limit below what was asked for).
        limits[EPHEMERAL_STORAGE] = requests.get(EPHEMERAL_STORAGE, DEFAULT_EPHEMERAL_STORAGE["limits"])
        requests.setdefault(EPHEMERAL_STORAGE, DEFAULT_EPHEMERAL_STORAGE["requests"])
    return resources


def pool_selector(pool: str) -> str:
    """The label selector of a pool's sandbox Pods (also the /scale selector)."""
    return f"{api.POOL_LABEL}={pool}"


def sandbox_pod(
    pool: PoolSpec,
    template: Template,
    *,
    name: str,
    region: str,
    zone: str | None,
    prewarm: bool = False,
    agent_key: bytes | None = None,
    shard: str | None = None,
    agent_bundle: AgentBundleImage | None = None,
) -> dict[str, Any]:
    """The Pod manifest of one sandbox of `pool` in `region` (and `zone`, when the planner picked one).

    With `agent_key`, the agent gets its own bearer token (derived from the key and `name`). With
    `shard`, its lease lives in that shard's ledger (core.ledger), never on the Pod. A template whose
    agent is injected needs `agent_bundle` (ValueError without one).
    """
    if template.agent == api.AGENT_INJECTED and agent_bundle is None:
        raise ValueError("spec.template.agent is injected, and no agent bundle image is configured")
    labels = {
        api.MANAGED_BY_LABEL: api.MANAGED_BY,
        api.POOL_LABEL: pool.name,
        api.SANDBOX_REGION_LABEL: region,
        api.TEMPLATE_HASH_LABEL: template.hash,
        api.IMAGE_KEY_LABEL: image_key(template.image),
        api.LEASE_STATE_LABEL: api.LEASE_FREE if shard is None else api.LEASE_IN_LEDGER,
    }
    if shard is not None:
        labels[api.SHARD_LABEL] = shard
    if prewarm:
        labels[PREWARM_LABEL] = "true"
    node_selector = {**template.node_selector, api.REGION_LABEL: region}
    if zone:
        node_selector[api.ZONE_LABEL] = zone
    container: dict[str, Any] = {
        "name": api.SANDBOX_CONTAINER,
        "image": template.image,
        "imagePullPolicy": template.image_pull_policy,
        "ports": [{"name": "agent", "containerPort": template.agent_port, "protocol": "TCP"}],
        # Ready means the agent's exec path answers, not merely that a process exists.
        "readinessProbe": {
            "httpGet": {"path": "/v1/ready", "port": template.agent_port},
            "periodSeconds": 1,
            "failureThreshold": 3,
        },
    }
    # A pool's own env never names the agent's token: it would replace the one only the gateway knows.
    env = [{"name": k, "value": v} for k, v in template.env if k != AGENT_TOKEN_ENV]
    if agent_key is not None:
        env.append({"name": AGENT_TOKEN_ENV, "value": agent_token(agent_key, name)})
    if pool.recycle is not None:
        # The agent copies its writable roots here before it serves, so a reset can put them back.
        env.append({"name": PRISTINE_DIR_ENV, "value": PRISTINE_DIR})
    if env:
        container["env"] = env
    container["resources"] = _sandbox_resources(template)
    container["securityContext"] = sandbox_security_context()
    spec: dict[str, Any] = {
        "runtimeClassName": template.runtime_class_name,
        "containers": [container],
        "nodeSelector": node_selector,
        # A sandbox whose agent dies has lost its state: fail visibly and get replaced, never restart.
        "restartPolicy": "Never",
        # Untrusted code runs inside: no API token, no service environment variables.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 5,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
    }
    if template.agent == api.AGENT_INJECTED and agent_bundle is not None:
        inject_agent(spec, container, agent_bundle, template.agent_port, template.commands_user)
    if template.image_pull_secrets:
        # For every image of the Pod: the sandbox's and, when injected, the agent bundle's.
        spec["imagePullSecrets"] = [{"name": name} for name in template.image_pull_secrets]
    if template.tolerations:
        spec["tolerations"] = [dict(t) for t in template.tolerations]
    if template.service_account_name:
        spec["serviceAccountName"] = template.service_account_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": pool.namespace,
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": api.API_VERSION,
                    "kind": api.POOL_KIND,
                    "name": pool.name,
                    "uid": pool.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


def _condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in pod.get("status", {}).get("conditions") or ():
        if condition.get("type") == kind:
            return condition  # type: ignore[no-any-return]
    return None


# How much of the kubelet's message a broken sandbox's reason keeps (a pull error names the image,
# the registry and its answer in a few hundred characters).
BROKEN_MESSAGE_CHARS = 300


def _broken_reason(pod: Mapping[str, Any]) -> str | None:
    """Why the Pod will not get Ready without a fix, or None.

    Its phase, or a container's waiting reason with the kubelet's message. Init containers count:
    the agent bundle's pull can fail too.
    """
    status = pod.get("status", {})
    if status.get("phase") in TERMINAL_PHASES:
        return f"Pod {status.get('phase')}"
    for container in (*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())):
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in BROKEN_WAITING_REASONS:
            message = " ".join(str(waiting.get("message") or "").split())[:BROKEN_MESSAGE_CHARS]
            return f"{reason}: {message}" if message else str(reason)
    return None


def sandbox_from_pod(pod: Mapping[str, Any]) -> SandboxPod | None:
    """The SandboxPod reading of a Pod, or None for a Pod without a pool label (not a sandbox).

    The one reading of a sandbox Pod, for the operator (which plans only `managed` ones) and the
    gateway alike. A missing lease-state label reads as no state at all: neither free (so never
    leased) nor leased (so never reaped).
    """
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    pool = labels.get(api.POOL_LABEL)
    if not pool:
        return None
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    ready = _condition(pod, "Ready")
    containers_ready = _condition(pod, "ContainersReady")
    # A Pod that is no longer Running (finished, or its node unknown) must not be leased even while
    # its last Ready condition still says True.
    is_ready = bool(ready and ready.get("status") == "True") and status.get("phase") == "Running"
    annotations = meta.get("annotations")
    reservation = reservation_from_annotations(annotations)
    broken_reason = _broken_reason(pod)
    return SandboxPod(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        pool=str(pool),
        region=str(labels.get(api.SANDBOX_REGION_LABEL, "")),
        resource_version=str(meta.get("resourceVersion", "")),
        state=str(labels.get(api.LEASE_STATE_LABEL, "")),
        ready=is_ready,
        terminating=bool(meta.get("deletionTimestamp")),
        address=status.get("podIP"),
        port=_agent_port(spec),
        lease=lease_from_annotations(annotations),
        expiry_annotation=_expiry_annotation(annotations),
        created_at=parse_time(meta.get("creationTimestamp")) or 0.0,
        image_key=str(labels.get(api.IMAGE_KEY_LABEL, "")),
        image_digest=_image_digest(status),
        zone=(spec.get("nodeSelector") or {}).get(api.ZONE_LABEL),
        template_hash=str(labels.get(api.TEMPLATE_HASH_LABEL, "")),
        node=spec.get("nodeName"),
        broken=broken_reason is not None,
        broken_reason=broken_reason or "",
        started=bool(containers_ready and containers_ready.get("status") == "True"),
        unready_since=None if is_ready or not ready else parse_time(ready.get("lastTransitionTime")),
        prewarm=labels.get(PREWARM_LABEL) == "true",
        managed=labels.get(api.MANAGED_BY_LABEL) == api.MANAGED_BY,
        episodes=episodes_from_annotations(annotations),
        reserved_for=reservation[0] if reservation else None,
        reserved_since=reservation[1] if reservation else None,
        shard=labels.get(api.SHARD_LABEL),
    )


def image_digest(image_id: str) -> str:
    """The digest in a container's imageID (`docker.io/x@sha256:...`, `sha256:...`), or all of it."""
    _, at, digest = image_id.rpartition("@")
    return digest if at else image_id


def _image_digest(status: Mapping[str, Any]) -> str:
    for container in status.get("containerStatuses") or ():
        if container.get("name") == api.SANDBOX_CONTAINER:
            return image_digest(str(container.get("imageID") or ""))
    return ""


def _expiry_annotation(annotations: Mapping[str, str] | None) -> float | None:
    """The old form of a lease's expiry (unix seconds), on Pods leased before it moved into the record."""
    raw = (annotations or {}).get(api.LEASE_EXPIRES_ANNOTATION)
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


def _agent_port(spec: Mapping[str, Any]) -> int:
    port = api.DEFAULT_AGENT_PORT
    for container in spec.get("containers") or ():
        if container.get("name") == api.SANDBOX_CONTAINER:
            for declared in container.get("ports") or ():
                port = int(declared.get("containerPort", port))
    return port


def startup_phases(pod: Mapping[str, Any]) -> dict[str, float] | None:
    """Seconds spent in each spin-up phase, from the Pod's own timestamps; None until it is Ready.

    Phases: created->scheduled, scheduled->started, started->ready, and the total.
    """
    ready = _condition(pod, "Ready")
    if not ready or ready.get("status") != "True":
        return None
    created = parse_time(pod.get("metadata", {}).get("creationTimestamp"))
    scheduled_condition = _condition(pod, "PodScheduled")
    scheduled = parse_time(scheduled_condition.get("lastTransitionTime")) if scheduled_condition else None
    started = None
    for container in pod.get("status", {}).get("containerStatuses") or ():
        running = (container.get("state") or {}).get("running") or {}
        started = parse_time(running.get("startedAt")) or started
    ready_at = parse_time(ready.get("lastTransitionTime"))
    if created is None or ready_at is None:
        return None
    scheduled = scheduled if scheduled is not None else created
    started = started if started is not None else scheduled
    # Timestamps have one-second resolution and come from different clocks: never report a negative.
    return {
        "scheduled": max(0.0, scheduled - created),
        "started": max(0.0, started - scheduled),
        "ready": max(0.0, ready_at - started),
        "total": max(0.0, ready_at - created),
    }


def pod_usage(pod: Mapping[str, Any]) -> tuple[str, Resources] | None:
    """(node, what the Pod asks the scheduler for) for a Pod that holds node capacity, else None."""
    spec = pod.get("spec", {})
    node = spec.get("nodeName")
    if not node or pod.get("status", {}).get("phase") in TERMINAL_PHASES:
        return None
    total = Resources(pods=1)
    for container in spec.get("containers") or ():
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        total = total + Resources.from_mapping(merged, pods=0)
    # Init containers run one at a time before the others: the Pod reserves the larger of the two.
    for container in spec.get("initContainers") or ():
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        init = Resources.from_mapping(merged, pods=0)
        total = Resources(
            max(total.cpu_millis, init.cpu_millis), max(total.memory_bytes, init.memory_bytes), 1
        )
    return str(node), total


def node_from_object(node: Mapping[str, Any]) -> Node:
    """A Node as capacity planning sees it."""
    meta = node.get("metadata", {})
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    status = node.get("status", {})
    ready = False
    for condition in status.get("conditions") or ():
        if condition.get("type") == "Ready":
            ready = condition.get("status") == "True"
    spec = node.get("spec", {})
    taints = tuple(
        Taint(str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", "NoSchedule")))
        for t in spec.get("taints") or ()
    )
    allocatable = Resources.from_mapping(status.get("allocatable"))
    return Node(
        name=str(meta.get("name", "")),
        region=labels.get(api.REGION_LABEL),
        zone=labels.get(api.ZONE_LABEL),
        ready=ready,
        schedulable=not spec.get("unschedulable", False),
        allocatable=allocatable,
        labels=labels,
        taints=taints,
    )


# The labels that tell one gateway Deployment's Pods from everything else in the namespace.
REPLICA_LABELS: Final = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
)


def replica_selector(pod: Mapping[str, Any]) -> str | None:
    """The label selector of the Pods of the same Deployment as `pod`; None without those labels."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if not all(isinstance(labels.get(name), str) and labels[name] for name in REPLICA_LABELS):
        return None
    return ",".join(f"{name}={labels[name]}" for name in REPLICA_LABELS)


def ready_replicas(pods: Iterable[Mapping[str, Any]], me: str, account: str) -> list[str]:
    """The IPs of the Ready, not deleting Pods other than `me` that run as ServiceAccount `account`.

    The account is part of the test: a Pod that merely copies the labels does not become a replica
    (callers' credentials go to the replicas), and one that runs as the gateway's own account holds
    every power of a gateway already.
    """
    found = []
    for pod in pods:
        metadata, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        ip = status.get("podIP")
        ready = _condition(pod, "Ready")
        if (
            metadata.get("name") == me
            or metadata.get("deletionTimestamp")
            or spec.get("serviceAccountName") != account
            or status.get("phase") != "Running"
            or ready is None
            or ready.get("status") != "True"
            or not isinstance(ip, str)
            or not ip
        ):
            continue
        found.append(ip)
    return sorted(found)
