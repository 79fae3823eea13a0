"""The SandboxPool CRD on the real apiserver: defaults, validation messages, printer columns, /scale."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.kube import Kubectl

pytestmark = pytest.mark.cluster

EXAMPLE = Path(__file__).resolve().parents[2] / "manifests" / "examples" / "sandboxpool.yaml"


def example(name: str = "python") -> dict[str, Any]:
    pool: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    pool["metadata"]["name"] = name
    return pool


def test_example_is_accepted_and_defaulted(kube: Kubectl) -> None:
    pool = example()
    del pool["spec"]["template"]["runtimeClassName"]
    del pool["spec"]["lease"]
    kube("create", "-f", "-", stdin=json.dumps(pool))
    stored = kube.json("get", "sandboxpool", "python")
    assert stored["spec"]["template"]["runtimeClassName"] == "gvisor"
    assert stored["spec"]["lease"] == {"defaultTTLSeconds": 900, "maxTTLSeconds": 14400}
    assert stored["spec"]["regions"][2]["weight"] == 1
    assert stored["spec"]["regions"][2]["minWarm"] == 0


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(pool: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node: Any = pool
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        if value is _DELETE:
            del node[leaf]
        elif leaf.isdigit():
            node[int(leaf)] = value
        else:
            node[leaf] = value

    return mutate


_DELETE = object()


INVALID: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("no image", _set("spec.template.image", _DELETE), "spec.template.image: Required value"),
    ("no regions", _set("spec.regions", []), "spec.regions: Invalid value: 0"),
    ("negative replicas", _set("spec.replicas", -1), "spec.replicas: Invalid value: -1"),
    (
        "duplicate region",
        _set("spec.regions.1.name", "us-east1"),
        'spec.regions[1]: Duplicate value: {"name":"us-east1"}',
    ),
    (
        "region name is not a label value",
        _set("spec.regions.0.name", "US East"),
        'spec.regions[0].name: Invalid value: "US East"',
    ),
    ("zero weight", _set("spec.regions.0.weight", 0), "spec.regions[0].weight: Invalid value: 0"),
    (
        "minWarm above maxSandboxes",
        _set("spec.regions.1.maxSandboxes", 0),
        'spec.regions[1].minWarm: Invalid value: "object": minWarm must be at most maxSandboxes',
    ),
    (
        "minWarm adds up to more than replicas",
        _set("spec.replicas", 2),
        "the regions' minWarm add up to more than spec.replicas",
    ),
    (
        "default TTL above max TTL",
        _set("spec.lease.defaultTTLSeconds", 9000),
        "lease.defaultTTLSeconds must be at most lease.maxTTLSeconds",
    ),
    ("agent port out of range", _set("spec.template.agentPort", 70000), "spec.template.agentPort"),
    (
        "unknown pull policy",
        _set("spec.template.imagePullPolicy", "Sometimes"),
        'spec.template.imagePullPolicy: Unsupported value: "Sometimes"',
    ),
    (
        "bad resource quantity",
        _set("spec.template.resources", {"limits": {"memory": "lots"}}),
        "spec.template.resources.limits.memory",
    ),
    (
        "autoscaling min above max",
        _set("spec.autoscaling", {"enabled": True, "minReplicas": 9, "maxReplicas": 3}),
        "autoscaling.minReplicas must be at most autoscaling.maxReplicas",
    ),
    (
        "image with whitespace",
        _set("spec.template.image", "python 3.11"),
        "spec.template.image: Invalid value",
    ),
]


@pytest.mark.parametrize(("case", "mutate", "message"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_pool_is_rejected_with_a_clear_message(
    kube: Kubectl, case: str, mutate: Callable[[dict[str, Any]], None], message: str
) -> None:
    pool = copy.deepcopy(example(name="bad"))
    mutate(pool)
    error = kube.create_error(pool)
    assert message in error, f"{case}: kubectl said {error!r}"
    assert error.startswith('The SandboxPool "bad" is invalid')


def test_unknown_field_is_rejected_by_strict_validation(kube: Kubectl) -> None:
    pool = example(name="typo")
    pool["spec"]["template"]["imagee"] = "x"
    error = kube.create_error(pool)
    assert 'unknown field "spec.template.imagee"' in error


def test_kubectl_get_shows_target_ready_leased_regions_age(kube: Kubectl) -> None:
    kube("create", "-f", "-", stdin=json.dumps(example()))
    status = {"status": {"ready": 9, "leased": 2, "regionSummary": "us-east1 6/6, europe-west4 3/3"}}
    kube(
        "patch",
        "sandboxpool",
        "python",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )
    header, row = kube("get", "sandboxpools").splitlines()
    assert header.split() == ["NAME", "TARGET", "READY", "LEASED", "REGIONS", "AGE"]
    assert row.split()[:5] == ["python", "12", "9", "2", "us-east1"]
    assert "europe-west4 3/3" in row


def test_kubectl_scale_moves_the_warm_target(kube: Kubectl) -> None:
    kube("create", "-f", "-", stdin=json.dumps(example()))
    kube("scale", "sandboxpool", "python", "--replicas=30")
    assert kube.json("get", "sandboxpool", "python")["spec"]["replicas"] == 30
    scale = kube.json("get", "sandboxpool", "python", "--subresource=scale")
    assert scale["kind"] == "Scale"
    assert scale["spec"]["replicas"] == 30
    # Scaling below what the regions' minWarm add up to is refused, through /scale too.
    refused = kube.run("scale", "sandboxpool", "python", "--replicas=1")
    assert refused.returncode != 0
    assert "minWarm add up to more than spec.replicas" in refused.stderr
