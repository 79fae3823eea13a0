"""What sandfleet observes, as plain frozen data: pools, their templates, sandboxes and nodes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from sandfleet.core import api
from sandfleet.core.leases import LeaseRecord
from sandfleet.core.recycle import RecyclePolicy
from sandfleet.core.resources import Resources
from sandfleet.core.timestamps import parse_time

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
# Those of them that mean the image could not be had (a pool's Degraded says ImagePullFailed).
IMAGE_PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")


# Every default below is the CRD schema's `default` (tests/unit/core/test_crd_defaults.py checks):
# the apiserver fills them in, and the code that reads an object without them assumes the same.


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
    # api.AGENT_IMAGE: the image's entrypoint is the agent; api.AGENT_INJECTED: any image, the
    # operator injects the agent bundle (core/pods.py). The image's default: it is what every pool
    # before the field ran, and sandfleet's task images own their tree as uid 1000, which an
    # injected agent's users (ids from 1,000,000) cannot write.
    agent: str = api.AGENT_IMAGE
    image_pull_secrets: tuple[str, ...] = ()
    # The image's user the episodes' commands run as (spec.template.commandsUser: root for most task
    # images); None: the agent's own unprivileged user. Such a pool is scored in clean sandboxes.
    commands_user: str | None = None

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
        if self.agent != api.AGENT_IMAGE:
            material["agent"] = self.agent
        if self.image_pull_secrets:
            material["imagePullSecrets"] = list(self.image_pull_secrets)
        if self.commands_user is not None:
            material["commandsUser"] = self.commands_user
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
class LeaseSpec:
    """The TTLs of a pool's leases (the CRD's spec.lease)."""

    default_ttl_seconds: int = 900
    max_ttl_seconds: int = 14_400
    # Where the pool's leases are written: api.STORE_LEDGER (batched, core.ledger) or api.STORE_POD.
    store: str = api.STORE_LEDGER


DEFAULT_REPLICAS: Final = 0  # spec.replicas
DEFAULT_PREWARM_TTL_SECONDS: Final = 600  # a SandboxPrewarm's spec.ttlSeconds


@dataclass(frozen=True)
class PoolSpec:
    """A SandboxPool as the operator and the gateway read it."""

    namespace: str
    name: str
    uid: str
    generation: int
    replicas: int
    regions: tuple[RegionSpec, ...]
    template: Template
    autoscaling: AutoscalingSpec = AutoscalingSpec()
    lease: LeaseSpec = LeaseSpec()
    recycle: RecyclePolicy | None = None  # spec.recycle (docs/operator.md)
    # The FLEET_SHARE_ANNOTATION a fleet gateway wrote: this member's fraction of `replicas` (None: all).
    fleet_share: float | None = None

    @property
    def key(self) -> str:
        """The pool's object key inside the operator (see `object_key`)."""
        return object_key(self.namespace, self.name)

    @property
    def max_sandboxes(self) -> int:
        """The most sandboxes (warm, starting and leased) the pool may ever hold, over its regions."""
        return sum(r.max_sandboxes for r in self.regions)


@dataclass(frozen=True)
class Prewarm:
    """A lookahead: keep `count` sandboxes of `image` warm in `pool` until `expires_at` (unix seconds)."""

    namespace: str
    name: str
    pool: str
    image: str
    count: int
    expires_at: float


def object_key(namespace: str, name: str) -> str:
    """A namespaced object's key inside the operator (pools, Pods): Kubernetes' own `ns/name`."""
    return f"{namespace}/{name}"


# Between a lease id's sandbox and its episode (never in a Pod name, unreserved in a URL).
EPISODE_MARK = "~"
# Between a fleet member cluster's name and the lease id inside it (never in a DNS label, so never
# in a member's name, a namespace or a Pod name; unreserved in a URL).
CLUSTER_MARK = "_"


def lease_id(namespace: str, name: str, episode: int = 0, cluster: str = "") -> str:
    """A lease id: `ns.name` for a sandbox's first episode, `ns.name~N` for its episode N (recycled).

    A namespace is a DNS label and holds no dot, so the first dot splits it back (`split_lease_id`);
    a Pod name holds no `~`. Each episode of a recycled sandbox has a lease id of its own, so a call
    made under an ended episode's lease never reaches the next one. A gateway over several member
    clusters prefixes the member that holds the sandbox: `member_ns.name[~N]` (`lease_cluster`).
    """
    local = f"{namespace}.{name}" if episode == 0 else f"{namespace}.{name}{EPISODE_MARK}{episode}"
    return f"{cluster}{CLUSTER_MARK}{local}" if cluster else local


def lease_cluster(value: str) -> tuple[str, str]:
    """(the member cluster a lease id names, the id inside that member); ("", value) without one."""
    cluster, mark, local = value.partition(CLUSTER_MARK)
    return (cluster, local) if mark else ("", value)


def sandbox_key(value: str) -> str:
    """The key of the sandbox a lease id names (the id without its episode)."""
    return value.partition(EPISODE_MARK)[0]


def lease_episode(value: str) -> int | None:
    """The episode a lease id names (0 without a mark), None when its mark is not a number."""
    _, mark, episode = value.partition(EPISODE_MARK)
    if not mark:
        return 0
    return int(episode) if episode.isdigit() and len(episode) < 10 else None


def split_lease_id(value: str) -> tuple[str, str] | None:
    """(namespace, pod name) of a lease id (a fleet member's, too), or None when it is not one of ours."""
    if len(value) > 381 or lease_episode(value) is None:
        return None
    namespace, dot, name = sandbox_key(lease_cluster(value)[1]).partition(".")
    if not dot or not namespace or not name:
        return None
    return namespace, name


@dataclass(frozen=True)
class SandboxPod:
    """One sandbox Pod: what the operator plans with and what the gateway leases and reaches.

    Read from a Pod by `sandfleet.core.pods.sandbox_from_pod`, made by the operator for a Pod it has
    just created, or by the local backend for a runsc sandbox. The client's handle to a leased
    sandbox is `sandfleet.client.Sandbox`.
    """

    namespace: str
    name: str
    pool: str
    region: str
    resource_version: str = ""
    state: str = api.LEASE_FREE  # the lease state: api.LEASE_FREE / _LEASED / _RELEASED / _RESERVED
    # Ready condition true *and* phase Running: a Pod whose phase moved on is never leased.
    ready: bool = False
    terminating: bool = False  # deletionTimestamp set
    address: str | None = None
    port: int = api.DEFAULT_AGENT_PORT
    lease: LeaseRecord | None = None
    # The expiry annotation older versions wrote beside the record; read only when there is no record.
    expiry_annotation: float | None = None
    created_at: float = 0.0
    image_key: str = ""  # which image it runs (`image_key`), for leases by image
    # The digest the runtime resolved its image to (a Pod's containerStatuses imageID), once known:
    # with `template_hash`, exactly what an episode ran on.
    image_digest: str = ""
    zone: str | None = None
    template_hash: str = ""
    node: str | None = None
    broken: bool = False
    # Why it is broken, in the kubelet's words ("ErrImagePull: ..."): what the pool's Degraded says.
    broken_reason: str = ""
    # Its containers got ready once (the sandbox works); Ready may still drop later, e.g. with its node.
    started: bool = False
    unready_since: float | None = None
    prewarm: bool = False
    managed: bool = True  # labelled managed-by sandfleet: only those are the operator's to plan and delete
    # Episodes it has served and been reset after (a recycling pool's; its agent's episode number).
    episodes: int = 0
    # Reserved (state LEASE_RESERVED): the (holder, run) whose next lease it waits for, and since when.
    reserved_for: tuple[str, str] | None = None
    reserved_since: float | None = None
    # A Pod whose lease lives in its namespace's ledger (core.ledger): its shard, and the revision of
    # its ledger entry it was read with. None: its lease is written on the Pod itself.
    shard: str | None = None
    entry_rev: int = 0
    # The fleet member cluster it runs in, as the gateway serving several names it ("": the only one).
    cluster: str = ""

    @property
    def key(self) -> str:
        """Its lease id (`lease_id`): the key every index of sandboxes files it under."""
        return lease_id(self.namespace, self.name, cluster=self.cluster)

    @property
    def version(self) -> str:
        """What a write conditional on this reading checks: the Pod's version, and its ledger entry's."""
        return self.resource_version if self.shard is None else f"{self.resource_version}/{self.entry_rev}"

    @property
    def leased(self) -> bool:
        return self.state == api.LEASE_LEASED

    @property
    def free(self) -> bool:
        return self.state == api.LEASE_FREE

    @property
    def warm(self) -> bool:
        return self.free and self.ready and not self.terminating

    @property
    def reserved(self) -> bool:
        return self.state == api.LEASE_RESERVED

    @property
    def next_lease_id(self) -> str:
        """The id its next lease gets: one per episode."""
        return lease_id(self.namespace, self.name, self.episodes, self.cluster)

    @property
    def lease_expires_at(self) -> float | None:
        return self.lease.expires_at if self.lease is not None else self.expiry_annotation

    def agent_url(self) -> str | None:
        return f"http://{self.address}:{self.port}" if self.address else None


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


# The defaults a missing field takes, read from the typed specs above (never restated).
_REGION: Final = RegionSpec(name="")
_TEMPLATE: Final = Template(image="")
_AUTOSCALING: Final = AutoscalingSpec()
_LEASE: Final = LeaseSpec()


def pool_from_object(body: Mapping[str, Any]) -> PoolSpec:
    """A PoolSpec from a SandboxPool object as the apiserver returns it (defaults applied)."""
    meta = body.get("metadata", {})
    spec = body.get("spec", {})
    tpl = spec.get("template", {})
    resources = tpl.get("resources") or {}
    template = Template(
        image=str(tpl.get("image", "")),
        image_pull_policy=str(tpl.get("imagePullPolicy", _TEMPLATE.image_pull_policy)),
        runtime_class_name=str(tpl.get("runtimeClassName", _TEMPLATE.runtime_class_name)),
        agent_port=int(tpl.get("agentPort", _TEMPLATE.agent_port)),
        env=tuple((str(e["name"]), str(e.get("value", ""))) for e in tpl.get("env") or ()),
        resources={k: dict(v) for k, v in resources.items() if isinstance(v, Mapping)},
        node_selector={str(k): str(v) for k, v in (tpl.get("nodeSelector") or {}).items()},
        tolerations=tuple(dict(t) for t in tpl.get("tolerations") or ()),
        readiness_deadline_seconds=int(
            tpl.get("readinessDeadlineSeconds", _TEMPLATE.readiness_deadline_seconds)
        ),
        service_account_name=str(tpl["serviceAccountName"]) if tpl.get("serviceAccountName") else None,
        agent=str(tpl.get("agent", _TEMPLATE.agent)),
        commands_user=str(tpl["commandsUser"]) if tpl.get("commandsUser") else None,
        image_pull_secrets=tuple(
            str(secret["name"])
            for secret in tpl.get("imagePullSecrets") or ()
            if isinstance(secret, Mapping) and secret.get("name")
        ),
    )
    regions = tuple(
        RegionSpec(
            name=str(r["name"]),
            weight=int(r.get("weight", _REGION.weight)),
            min_warm=int(r.get("minWarm", _REGION.min_warm)),
            max_sandboxes=int(r.get("maxSandboxes", _REGION.max_sandboxes)),
            zones=tuple(str(z) for z in r.get("zones") or ()),
        )
        for r in spec.get("regions") or ()
    )
    auto = spec.get("autoscaling") or {}
    autoscaling = AutoscalingSpec(
        enabled=bool(auto.get("enabled", _AUTOSCALING.enabled)),
        min_replicas=int(auto.get("minReplicas", _AUTOSCALING.min_replicas)),
        max_replicas=int(auto.get("maxReplicas", _AUTOSCALING.max_replicas)),
        headroom=float(auto.get("headroom", _AUTOSCALING.headroom)),
        scale_down_delay_seconds=int(
            auto.get("scaleDownDelaySeconds", _AUTOSCALING.scale_down_delay_seconds)
        ),
    )
    lease = spec.get("lease") or {}
    lease_spec = LeaseSpec(
        default_ttl_seconds=int(lease.get("defaultTTLSeconds", _LEASE.default_ttl_seconds)),
        max_ttl_seconds=int(lease.get("maxTTLSeconds", _LEASE.max_ttl_seconds)),
        store=str(lease.get("store", _LEASE.store)),
    )
    recycle = spec.get("recycle")
    recycle_policy = (
        RecyclePolicy(max_episodes=int(recycle["maxEpisodes"]), max_seconds=float(recycle["maxSeconds"]))
        if isinstance(recycle, Mapping)
        else None
    )
    return PoolSpec(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        generation=int(meta.get("generation", 0)),
        replicas=int(spec.get("replicas", DEFAULT_REPLICAS)),
        regions=regions,
        template=template,
        autoscaling=autoscaling,
        lease=lease_spec,
        recycle=recycle_policy,
        fleet_share=parse_share((meta.get("annotations") or {}).get(api.FLEET_SHARE_ANNOTATION)),
    )


def parse_share(value: object) -> float | None:
    """A fleet share annotation's fraction, or None when absent or not a number from 0 to 1 (ignored)."""
    try:
        share = float(str(value))
    except ValueError:
        return None
    return share if 0.0 <= share <= 1.0 else None


def prewarm_from_object(body: Mapping[str, Any], now: float) -> Prewarm:
    """A Prewarm from a SandboxPrewarm object: expiresAt if set, else ttlSeconds after the last write."""
    meta, spec = body.get("metadata", {}), body.get("spec", {})
    # managedFields record when each writer last changed the object: re-applying extends the TTL.
    written = [parse_time(meta.get("creationTimestamp"))]
    written += [parse_time(entry.get("time")) for entry in meta.get("managedFields") or ()]
    last_write = max((t for t in written if t is not None), default=now)
    expires_at = parse_time(spec.get("expiresAt")) or last_write + float(
        spec.get("ttlSeconds", DEFAULT_PREWARM_TTL_SECONDS)
    )
    return Prewarm(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        pool=str(spec.get("pool", "")),
        image=str(spec.get("image", "")),
        count=int(spec.get("count", 0)),
        expires_at=expires_at,
    )
