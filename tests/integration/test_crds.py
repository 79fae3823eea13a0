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
    assert stored["spec"]["lease"] == {"defaultTTLSeconds": 900, "maxTTLSeconds": 14400, "store": "ledger"}
    assert stored["spec"]["regions"][2]["weight"] == 1
    assert stored["spec"]["regions"][2]["minWarm"] == 0
    assert "recycle" not in stored["spec"]  # opt-in: no default


def test_a_pool_whose_commands_run_as_root_is_accepted_but_never_recycled(kube: Kubectl) -> None:
    pool = example(name="as-root")
    pool["spec"]["template"] |= {"agent": "injected", "commandsUser": "root"}
    kube("create", "-f", "-", stdin=json.dumps(pool))
    assert kube.json("get", "sandboxpool", "as-root")["spec"]["template"]["commandsUser"] == "root"
    pool = example(name="as-root-recycled")
    pool["spec"]["template"] |= {"agent": "injected", "commandsUser": "root"}
    pool["spec"]["recycle"] = {"maxEpisodes": 16, "maxSeconds": 3600}
    refused = kube.run("create", "-f", "-", stdin=json.dumps(pool))
    assert refused.returncode != 0
    assert "is never reset for another episode" in refused.stderr


def test_a_recycling_pool_is_accepted_as_written(kube: Kubectl) -> None:
    pool = example(name="recycling")
    pool["spec"]["recycle"] = {"maxEpisodes": 16, "maxSeconds": 3600}
    kube("create", "-f", "-", stdin=json.dumps(pool))
    assert kube.json("get", "sandboxpool", "recycling")["spec"]["recycle"] == pool["spec"]["recycle"]


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
    (
        "recycling for one episode",
        _set("spec.recycle", {"maxEpisodes": 1, "maxSeconds": 600}),
        "spec.recycle.maxEpisodes: Invalid value: 1",
    ),
    (
        "recycling without an age bound",
        _set("spec.recycle", {"maxEpisodes": 8}),
        "spec.recycle.maxSeconds: Required value",
    ),
    (
        "commands as the image's user without the injected agent",
        _set("spec.template.commandsUser", "root"),
        "template.commandsUser needs template.agent: injected",
    ),
    (
        "a commands user that is no user name",
        _set("spec.template.commandsUser", "root; rm -rf /"),
        "spec.template.commandsUser: Invalid value",
    ),
]


def _regions(count: int) -> list[dict[str, Any]]:
    return [{"name": f"region-{i}"} for i in range(count)]


def _nested(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"leaf": "x"}
    for _ in range(depth):
        node = {"deeper": node}
    return node


# Hostile objects: what a careless script or an attacker with create rights might send. Each is refused
# by the apiserver itself, before the operator ever reads it, with a message that names the field.
HOSTILE: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("huge image", _set("spec.template.image", "a" * 100_000), "spec.template.image: Too long"),
    (
        "huge env value",
        _set("spec.template.env.0.value", "v" * 40_000),
        "spec.template.env[0].value: Too long",
    ),
    ("huge env name", _set("spec.template.env.0.name", "N" * 1_000), "spec.template.env[0].name: Too long"),
    ("huge zone", _set("spec.regions.0.zones", ["z" * 5_000]), "spec.regions[0].zones[0]: Too long"),
    ("too many regions", _set("spec.regions", _regions(33)), "spec.regions: Too many: 33"),
    (
        "too many zones",
        _set("spec.regions.0.zones", [f"z{i}" for i in range(17)]),
        "spec.regions[0].zones: Too many",
    ),
    (
        "too many env vars",
        _set("spec.template.env", [{"name": f"V{i}", "value": "1"} for i in range(129)]),
        "spec.template.env: Too many: 129",
    ),
    (
        "too many node selector labels",
        _set("spec.template.nodeSelector", {f"k{i}": "v" for i in range(65)}),
        "spec.template.nodeSelector: Too many: 65",
    ),
    (
        "too many tolerations",
        _set("spec.template.tolerations", [{"operator": "Exists"}] * 65),
        "spec.template.tolerations: Too many: 65",
    ),
    (
        "deeply nested toleration",
        _set("spec.template.tolerations", [{"key": "k", "extra": _nested(60)}]),
        'unknown field "spec.template.tolerations[0].extra"',
    ),
    (
        "object where a string belongs",
        _set("spec.template.tolerations", [{"key": _nested(5)}]),
        "spec.template.tolerations[0].key",
    ),
    ("negative minWarm", _set("spec.regions.0.minWarm", -1), "spec.regions[0].minWarm: Invalid value: -1"),
    ("negative weight", _set("spec.regions.0.weight", -5), "spec.regions[0].weight: Invalid value: -5"),
    ("replicas past int32", _set("spec.replicas", 2**31), "spec.replicas: Invalid value: 2147483648"),
    ("replicas past int64", _set("spec.replicas", 2**70), "spec.replicas"),
    ("minWarm past int32", _set("spec.regions.2.minWarm", 2**40), "spec.regions[2].minWarm: Invalid value"),
    ("fractional replicas", _set("spec.replicas", 1.5), "spec.replicas: Invalid value"),
    ("replicas as a string", _set("spec.replicas", "12; rm -rf /"), "spec.replicas: Invalid value"),
    (
        "TTL past a week",
        _set("spec.lease", {"defaultTTLSeconds": 2**31 - 1, "maxTTLSeconds": 2**31 - 1}),
        "spec.lease.maxTTLSeconds: Invalid value",
    ),
    ("injection in a region", _set("spec.regions.0.name", "us'; DROP TABLE pods;--"), "spec.regions[0].name"),
    ("injection in a zone", _set("spec.regions.0.zones", ["$(reboot)"]), "spec.regions[0].zones[0]"),
    ("injection in the image", _set("spec.template.image", "img;$(curl${IFS}evil)"), "spec.template.image"),
    ("shell in an env name", _set("spec.template.env.0.name", "A=$(id)"), "spec.template.env[0].name"),
    ("newline in the image", _set("spec.template.image", "img\nINJECTED: 1"), "spec.template.image"),
    ("path in the runtime class", _set("spec.template.runtimeClassName", "../../runc"), "runtimeClassName"),
    (
        "unknown toleration effect",
        _set("spec.template.tolerations", [{"key": "k", "effect": "Evict"}]),
        'spec.template.tolerations[0].effect: Unsupported value: "Evict"',
    ),
    ("pool name longer than a label value", _set("metadata.name", "p" * 64), "at most 63 characters"),
]


@pytest.mark.parametrize(("case", "mutate", "message"), HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_pool_is_rejected_with_a_clear_message(
    kube: Kubectl, case: str, mutate: Callable[[dict[str, Any]], None], message: str
) -> None:
    pool = copy.deepcopy(example(name="bad"))
    mutate(pool)
    error = kube.create_error(pool)
    assert message in error, f"{case}: kubectl said {error[:2000]!r}"
    assert len(error) < 20_000, "the message repeats the whole hostile value back"


@pytest.mark.parametrize(
    "name", ["pool;rm -rf /", "../etc/passwd", "Pool", "pool\u0000", "a" * 254, "<script>"], ids=repr
)
def test_hostile_names_are_refused_by_the_apiserver(kube: Kubectl, name: str) -> None:
    error = kube.create_error(example(name=name))
    assert "metadata.name" in error or "name" in error.lower(), error[:2000]


def test_the_largest_legal_pool_is_accepted(kube: Kubectl) -> None:
    """The limits are limits, not lower than what a big real pool needs."""
    pool = example(name="p" * 63)
    pool["spec"]["replicas"] = 100_000
    pool["spec"]["regions"] = [{"name": f"region-{i}", "maxSandboxes": 100_000} for i in range(32)]
    pool["spec"]["template"]["env"] = [{"name": f"V{i}", "value": "x" * 200} for i in range(128)]
    pool["spec"]["template"]["tolerations"] = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    pool["spec"]["template"]["nodeSelector"] = {"sandfleet.dev/pool": "yes"}
    pool["spec"]["template"]["image"] = "registry.example.com:5000/team/sandbox:1.2.3@sha256:" + "a" * 64
    kube("create", "-f", "-", stdin=json.dumps(pool))


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
