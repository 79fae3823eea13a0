"""Every default in the CRD schemas is the typed spec's default, and what the readers assume when absent."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandfleet.core import api
from sandfleet.core.model import (
    DEFAULT_PREWARM_TTL_SECONDS,
    DEFAULT_REPLICAS,
    AutoscalingSpec,
    LeaseSpec,
    PoolSpec,
    RegionSpec,
    Template,
    parse_time,
    pool_from_object,
    prewarm_from_object,
)

CRDS = Path(__file__).resolve().parents[3] / "manifests" / "crds"

# A pool with nothing optional set: what it reads as is what the code assumes when a field is absent.
BARE_POOL = pool_from_object(
    {"metadata": {"namespace": "ns", "name": "p"}, "spec": {"regions": [{"name": "r"}], "template": {}}}
)
BARE_REGION = BARE_POOL.regions[0]
BARE_TEMPLATE = BARE_POOL.template


def _bare_prewarm_ttl() -> float:
    written = "2026-01-01T00:00:00Z"
    prewarm = prewarm_from_object({"metadata": {"creationTimestamp": written}, "spec": {}}, now=0.0)
    return prewarm.expires_at - (parse_time(written) or 0.0)


# (kind, schema path) -> (the typed spec's default, what a reader assumes when the field is absent).
Pair = tuple[Any, Any]
EXPECTED: dict[tuple[str, str], Callable[[], Pair]] = {
    (api.POOL_KIND, "spec.replicas"): lambda: (DEFAULT_REPLICAS, BARE_POOL.replicas),
    (api.POOL_KIND, "spec.regions[].weight"): lambda: (RegionSpec("r").weight, BARE_REGION.weight),
    (api.POOL_KIND, "spec.regions[].minWarm"): lambda: (RegionSpec("r").min_warm, BARE_REGION.min_warm),
    (api.POOL_KIND, "spec.regions[].maxSandboxes"): lambda: (
        RegionSpec("r").max_sandboxes,
        BARE_REGION.max_sandboxes,
    ),
    (api.POOL_KIND, "spec.template.imagePullPolicy"): lambda: (
        Template("i").image_pull_policy,
        BARE_TEMPLATE.image_pull_policy,
    ),
    (api.POOL_KIND, "spec.template.runtimeClassName"): lambda: (
        Template("i").runtime_class_name,
        BARE_TEMPLATE.runtime_class_name,
    ),
    (api.POOL_KIND, "spec.template.agentPort"): lambda: (Template("i").agent_port, BARE_TEMPLATE.agent_port),
    (api.POOL_KIND, "spec.template.readinessDeadlineSeconds"): lambda: (
        Template("i").readiness_deadline_seconds,
        BARE_TEMPLATE.readiness_deadline_seconds,
    ),
    (api.POOL_KIND, "spec.lease"): lambda: (
        _lease_object(LeaseSpec()),
        _lease_object(BARE_POOL.lease),
    ),
    (api.POOL_KIND, "spec.lease.defaultTTLSeconds"): lambda: (
        LeaseSpec().default_ttl_seconds,
        BARE_POOL.lease.default_ttl_seconds,
    ),
    (api.POOL_KIND, "spec.lease.maxTTLSeconds"): lambda: (
        LeaseSpec().max_ttl_seconds,
        BARE_POOL.lease.max_ttl_seconds,
    ),
    (api.POOL_KIND, "spec.autoscaling.enabled"): lambda: (
        AutoscalingSpec().enabled,
        BARE_POOL.autoscaling.enabled,
    ),
    (api.POOL_KIND, "spec.autoscaling.minReplicas"): lambda: (
        AutoscalingSpec().min_replicas,
        BARE_POOL.autoscaling.min_replicas,
    ),
    (api.POOL_KIND, "spec.autoscaling.maxReplicas"): lambda: (
        AutoscalingSpec().max_replicas,
        BARE_POOL.autoscaling.max_replicas,
    ),
    (api.POOL_KIND, "spec.autoscaling.headroom"): lambda: (
        AutoscalingSpec().headroom,
        BARE_POOL.autoscaling.headroom,
    ),
    (api.POOL_KIND, "spec.autoscaling.scaleDownDelaySeconds"): lambda: (
        AutoscalingSpec().scale_down_delay_seconds,
        BARE_POOL.autoscaling.scale_down_delay_seconds,
    ),
    ("SandboxPrewarm", "spec.ttlSeconds"): lambda: (DEFAULT_PREWARM_TTL_SECONDS, _bare_prewarm_ttl()),
}


def _lease_object(lease: LeaseSpec) -> dict[str, int]:
    return {"defaultTTLSeconds": lease.default_ttl_seconds, "maxTTLSeconds": lease.max_ttl_seconds}


def _defaults(schema: dict[str, Any], path: str) -> Iterator[tuple[str, Any]]:
    """(path, default) of every property in `schema` that declares one, depth first."""
    if "default" in schema:
        yield path, schema["default"]
    for name, child in (schema.get("properties") or {}).items():
        yield from _defaults(child, f"{path}.{name}" if path else name)
    if "items" in schema:
        yield from _defaults(schema["items"], f"{path}[]")


def _crd_defaults() -> list[tuple[str, str, Any]]:
    found = []
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        kind = crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            for where, default in _defaults(version["schema"]["openAPIV3Schema"], ""):
                found.append((kind, where, default))
    return found


CRD_DEFAULTS = _crd_defaults()


def test_the_crds_declare_defaults() -> None:
    assert len(CRD_DEFAULTS) >= len(EXPECTED)


@pytest.mark.parametrize(
    ("kind", "where", "default"), CRD_DEFAULTS, ids=[f"{k}:{w}" for k, w, _ in CRD_DEFAULTS]
)
def test_each_crd_default_is_the_typed_default(kind: str, where: str, default: Any) -> None:
    assert (kind, where) in EXPECTED, f"{kind} {where} has a CRD default ({default!r}) no typed spec states"
    typed, assumed = EXPECTED[(kind, where)]()
    assert typed == default, f"{kind} {where}: the CRD says {default!r}, the typed spec {typed!r}"
    assert assumed == default, f"{kind} {where}: the CRD says {default!r}, a reader assumes {assumed!r}"


def test_pool_spec_carries_its_lease_ttls() -> None:
    pool = pool_from_object({"spec": {"lease": {"defaultTTLSeconds": 60, "maxTTLSeconds": 600}}})
    assert isinstance(pool, PoolSpec)
    assert pool.lease == LeaseSpec(default_ttl_seconds=60, max_ttl_seconds=600)
