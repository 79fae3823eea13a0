"""What the operator observes, as plain frozen data: pools, their templates, sandboxes and nodes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sandfleet.core import api
from sandfleet.core.resources import Resources

# Pods made for a per-image pre-warm carry this label, so they never stand in for the pool's own warm
# sandboxes while a template change rolls out (they run another image).
PREWARM_LABEL = f"{api.GROUP}/prewarm"

# Container states that mean the sandbox will not become Ready without someone fixing the template.
BROKEN_WAITING_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


@dataclass(frozen=True)
class RegionSpec:
    """One region of a pool: its weight, its floor and its ceiling, and the zones to spread over."""

    name: str
    weight: int = 1
    min_warm: int = 0
    max_sandboxes: int = 100_000
    zones: tuple[str, ...] = ()


@dataclass(frozen=True)
class Template:
    """What every sandbox of a pool runs (the CRD's spec.template, normalised)."""

    image: str
    image_pull_policy: str = "IfNotPresent"
    runtime_class_name: str = api.DEFAULT_RUNTIME_CLASS
    agent_port: int = api.DEFAULT_AGENT_PORT
    env: tuple[tuple[str, str], ...] = ()
    resources: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    readiness_deadline_seconds: int = 120
    service_account_name: str | None = None

    @property
    def requests(self) -> Resources:
        """What one sandbox asks the scheduler for (limits stand in for missing requests, as in a Pod)."""
        merged = {**dict(self.resources.get("limits", {})), **dict(self.resources.get("requests", {}))}
        return replace(Resources.from_mapping(merged), pods=1)

    def with_image(self, image: str) -> Template:
        return replace(self, image=image)

    @property
    def hash(self) -> str:
        """A short digest of everything that changes the Pod, so a template change rolls out."""
        material = {
            "image": self.image,
            "imagePullPolicy": self.image_pull_policy,
            "runtimeClassName": self.runtime_class_name,
            "agentPort": self.agent_port,
            "env": list(self.env),
            "resources": self.resources,
            "nodeSelector": dict(self.node_selector),
            "tolerations": list(self.tolerations),
        }
        # Only when set, so pools that never name an account keep their hash (and their Pods).
        if self.service_account_name:
            material["serviceAccountName"] = self.service_account_name
        digest = hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()
        return digest[:10]


def image_key(image: str) -> str:
    """A label-safe key for an image reference (image names hold `/` and `:`, labels cannot)."""
    return hashlib.sha256(image.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class AutoscalingSpec:
    """Demand-driven warm target bounds (the CRD's spec.autoscaling)."""

    enabled: bool = False
    min_replicas: int = 0
    max_replicas: int = 100
    headroom: float = 0.2
    scale_down_delay_seconds: int = 300


@dataclass(frozen=True)
class PoolSpec:
    """A SandboxPool as the planner needs it."""

    namespace: str
    name: str
    uid: str
    generation: int
    replicas: int
    regions: tuple[RegionSpec, ...]
    template: Template
    autoscaling: AutoscalingSpec = AutoscalingSpec()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Prewarm:
    """A lookahead: keep `count` sandboxes of `image` warm in `pool` until `expires_at` (unix seconds)."""

    namespace: str
    name: str
    pool: str
    image: str
    count: int
    expires_at: float


@dataclass(frozen=True)
class Sandbox:
    """One sandbox Pod as observed (or as expected, right after the operator created it)."""

    name: str
    region: str
    zone: str | None
    template_hash: str
    lease_state: str
    created_at: float
    ready: bool = False
    broken: bool = False
    node: str | None = None
    deleting: bool = False
    prewarm: bool = False
    lease_expires_at: float | None = None
    image_key: str = ""
    # Its containers got ready once (the sandbox works); Ready may still drop later, e.g. with its node.
    started: bool = False
    unready_since: float | None = None

    @property
    def leased(self) -> bool:
        return self.lease_state == api.LEASE_LEASED

    @property
    def free(self) -> bool:
        return self.lease_state == api.LEASE_FREE


@dataclass(frozen=True)
class Taint:
    """A node taint (only NoSchedule and NoExecute keep new sandboxes off a node)."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class Node:
    """One node as capacity planning sees it."""

    name: str
    region: str | None
    zone: str | None
    ready: bool
    schedulable: bool
    allocatable: Resources
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()


def pool_from_object(body: Mapping[str, Any]) -> PoolSpec:
    """A PoolSpec from a SandboxPool object as the apiserver returns it (defaults applied)."""
    meta = body.get("metadata", {})
    spec = body.get("spec", {})
    tpl = spec.get("template", {})
    resources = tpl.get("resources") or {}
    template = Template(
        image=str(tpl.get("image", "")),
        image_pull_policy=str(tpl.get("imagePullPolicy", "IfNotPresent")),
        runtime_class_name=str(tpl.get("runtimeClassName", api.DEFAULT_RUNTIME_CLASS)),
        agent_port=int(tpl.get("agentPort", api.DEFAULT_AGENT_PORT)),
        env=tuple((str(e["name"]), str(e.get("value", ""))) for e in tpl.get("env") or ()),
        resources={k: dict(v) for k, v in resources.items() if isinstance(v, Mapping)},
        node_selector={str(k): str(v) for k, v in (tpl.get("nodeSelector") or {}).items()},
        tolerations=tuple(dict(t) for t in tpl.get("tolerations") or ()),
        readiness_deadline_seconds=int(tpl.get("readinessDeadlineSeconds", 120)),
        service_account_name=str(tpl["serviceAccountName"]) if tpl.get("serviceAccountName") else None,
    )
    regions = tuple(
        RegionSpec(
            name=str(r["name"]),
            weight=int(r.get("weight", 1)),
            min_warm=int(r.get("minWarm", 0)),
            max_sandboxes=int(r.get("maxSandboxes", 100_000)),
            zones=tuple(str(z) for z in r.get("zones") or ()),
        )
        for r in spec.get("regions") or ()
    )
    auto = spec.get("autoscaling") or {}
    autoscaling = AutoscalingSpec(
        enabled=bool(auto.get("enabled", False)),
        min_replicas=int(auto.get("minReplicas", 0)),
        max_replicas=int(auto.get("maxReplicas", 100)),
        headroom=float(auto.get("headroom", 0.2)),
        scale_down_delay_seconds=int(auto.get("scaleDownDelaySeconds", 300)),
    )
    return PoolSpec(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        generation=int(meta.get("generation", 0)),
        replicas=int(spec.get("replicas", 0)),
        regions=regions,
        template=template,
        autoscaling=autoscaling,
    )


def parse_time(value: str | None) -> float | None:
    """Unix seconds from an RFC 3339 timestamp as the apiserver writes them."""
    if not value:
        return None
    return datetime.fromisoformat(value).timestamp()


def prewarm_from_object(body: Mapping[str, Any], now: float) -> Prewarm:
    """A Prewarm from a SandboxPrewarm object: expiresAt if set, else ttlSeconds after the last write."""
    meta, spec = body.get("metadata", {}), body.get("spec", {})
    # managedFields record when each writer last changed the object: re-applying extends the TTL.
    written = [parse_time(meta.get("creationTimestamp"))]
    written += [parse_time(entry.get("time")) for entry in meta.get("managedFields") or ()]
    last_write = max((t for t in written if t is not None), default=now)
    expires_at = parse_time(spec.get("expiresAt")) or last_write + float(spec.get("ttlSeconds", 600))
    return Prewarm(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        pool=str(spec.get("pool", "")),
        image=str(spec.get("image", "")),
        count=int(spec.get("count", 0)),
        expires_at=expires_at,
    )
