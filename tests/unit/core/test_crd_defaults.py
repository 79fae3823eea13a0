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
    LeaseSpec,
    PoolSpec,
    RegionSpec,
    Template,
    pool_from_object,
    prewarm_from_object,
)
from sandfleet.core.recycle import RecyclePolicy
from sandfleet.core.timestamps import parse_time

CRDS = Path(__file__).resolve().parents[3] / "manifests" / "crds"

# A pool with nothing optional set: what it reads as is what the code assumes when a field is absent.
BARE_POOL = pool_from_object(
    {"metadata": {"namespace": "ns", "name": "p"}, "spec": {"regions": [{"name": "r"}], "template": {}}}
)


def _bare_prewarm_ttl() -> float:
    written = "2026-01-01T00:00:00Z"
    prewarm = prewarm_from_object({"metadata": {"creationTimestamp": written}, "spec": {}}, now=0.0)
    return prewarm.expires_at - (parse_time(written) or 0.0)


# The typed specs with nothing but their defaults (the required fields filled in).
TYPED_POOL = PoolSpec("ns", "p", "", 0, DEFAULT_REPLICAS, (RegionSpec("r"),), Template(""))


def _lease_object(lease: LeaseSpec) -> dict[str, int | str]:
    return {
        "defaultTTLSeconds": lease.default_ttl_seconds,
        "maxTTLSeconds": lease.max_ttl_seconds,
        "store": lease.store,
    }


def _field(dotted: str) -> Callable[[PoolSpec], Any]:
    def read(pool: PoolSpec) -> Any:
        value: Any = pool
        for part in dotted.split("."):
            value = value[int(part)] if part.isdigit() else getattr(value, part)
        return value

    return read


# SandboxPool schema path -> where a PoolSpec keeps it.
POOL_FIELDS: dict[str, Callable[[PoolSpec], Any]] = {
    "spec.replicas": _field("replicas"),
    "spec.regions[].weight": _field("regions.0.weight"),
    "spec.regions[].minWarm": _field("regions.0.min_warm"),
    "spec.regions[].maxSandboxes": _field("regions.0.max_sandboxes"),
    "spec.template.imagePullPolicy": _field("template.image_pull_policy"),
    "spec.template.runtimeClassName": _field("template.runtime_class_name"),
    "spec.template.agentPort": _field("template.agent_port"),
    "spec.template.readinessDeadlineSeconds": _field("template.readiness_deadline_seconds"),
    "spec.template.agent": _field("template.agent"),
    "spec.lease": lambda pool: _lease_object(pool.lease),
    "spec.lease.defaultTTLSeconds": _field("lease.default_ttl_seconds"),
    "spec.lease.maxTTLSeconds": _field("lease.max_ttl_seconds"),
    "spec.lease.store": _field("lease.store"),
    "spec.autoscaling.enabled": _field("autoscaling.enabled"),
    "spec.autoscaling.minReplicas": _field("autoscaling.min_replicas"),
    "spec.autoscaling.maxReplicas": _field("autoscaling.max_replicas"),
    "spec.autoscaling.headroom": _field("autoscaling.headroom"),
    "spec.autoscaling.scaleDownDelaySeconds": _field("autoscaling.scale_down_delay_seconds"),
}


def _expected(kind: str, where: str) -> tuple[Any, Any] | None:
    """(the typed spec's default, what a reader assumes when the field is absent), or None if unmapped."""
    if kind == api.POOL_KIND and where in POOL_FIELDS:
        read = POOL_FIELDS[where]
        return read(TYPED_POOL), read(BARE_POOL)
    if (kind, where) == ("SandboxPrewarm", "spec.ttlSeconds"):
        return DEFAULT_PREWARM_TTL_SECONDS, _bare_prewarm_ttl()
    return None


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
    assert len(CRD_DEFAULTS) == len(POOL_FIELDS) + 1  # + the prewarm's ttlSeconds


@pytest.mark.parametrize(
    ("kind", "where", "default"), CRD_DEFAULTS, ids=[f"{k}:{w}" for k, w, _ in CRD_DEFAULTS]
)
def test_each_crd_default_is_the_typed_default(kind: str, where: str, default: Any) -> None:
    expected = _expected(kind, where)
    assert expected is not None, f"{kind} {where} has a CRD default ({default!r}) no typed spec states"
    typed, assumed = expected
    assert typed == default, f"{kind} {where}: the CRD says {default!r}, the typed spec {typed!r}"
    assert assumed == default, f"{kind} {where}: the CRD says {default!r}, a reader assumes {assumed!r}"


def test_pool_spec_carries_its_lease_ttls() -> None:
    pool = pool_from_object({"spec": {"lease": {"defaultTTLSeconds": 60, "maxTTLSeconds": 600}}})
    assert isinstance(pool, PoolSpec)
    assert pool.lease == LeaseSpec(default_ttl_seconds=60, max_ttl_seconds=600)


def test_pool_spec_carries_its_recycle_policy_only_when_set() -> None:
    assert BARE_POOL.recycle is None
    pool = pool_from_object({"spec": {"recycle": {"maxEpisodes": 8, "maxSeconds": 1800}}})
    assert pool.recycle == RecyclePolicy(max_episodes=8, max_seconds=1800)


@pytest.mark.parametrize(
    ("annotation", "share"),
    [("0.5", 0.5), ("1", 1.0), ("0", 0.0), ("1.5", None), ("-0.1", None), ("half", None), ("nan", None)],
)
def test_a_fleet_share_is_read_when_it_is_a_fraction_and_ignored_otherwise(
    annotation: str, share: float | None
) -> None:
    body = {"metadata": {"annotations": {api.FLEET_SHARE_ANNOTATION: annotation}}, "spec": {}}
    assert pool_from_object(body).fleet_share == share
    assert pool_from_object({"spec": {}}).fleet_share is None
