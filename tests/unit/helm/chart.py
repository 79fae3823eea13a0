"""Helpers for the chart's tests: the pinned helm binary, rendering, label selectors."""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from localcluster import build

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "helm" / "sandfleet"
EVERYTHING = CHART / "ci" / "everything-values.yaml"

Manifest = dict[str, Any]


@functools.cache
def helm_binary() -> Path:
    """The pinned helm (hack/build/helm): a cache hit after `hack/cluster build`, else built now."""
    (helm,) = [b for b in build.cluster_builds() if b.name == "helm"]
    return build.build(helm) / "helm"


def helm(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@functools.cache
def _render(args: tuple[str, ...], release: str, namespace: str) -> str:
    result = helm("template", release, str(CHART), "--namespace", namespace, *args)
    if result.returncode != 0:
        raise AssertionError(f"helm template {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout


def render(
    *args: str, release: str = "sandfleet", namespace: str = "sandfleet", tests: bool = True
) -> list[Manifest]:
    """`helm template` with extra args (-f, --set), parsed; hooks (helm test) included unless told."""
    text = _render(tuple(args), release, namespace)
    docs = [d for d in yaml.safe_load_all(text) if d]
    if not tests:
        docs = [d for d in docs if "helm.sh/hook" not in (d["metadata"].get("annotations") or {})]
    return docs


def render_everything(**kwargs: Any) -> list[Manifest]:
    return render("-f", str(EVERYTHING), **kwargs)


def objects(docs: Iterable[Manifest], kind: str) -> list[Manifest]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: Iterable[Manifest], kind: str, name: str) -> Manifest:
    for doc in docs:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise AssertionError(f"no {kind} {name} rendered")


def matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a Kubernetes label selector (matchLabels, matchExpressions) selects `labels`."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or ():
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        present = key in labels
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
    return True


def pod_templates(docs: Iterable[Manifest]) -> dict[str, Manifest]:
    """Every Pod the chart runs, by name: Deployments' templates and the helm test Pod."""
    pods: dict[str, Manifest] = {}
    for doc in docs:
        if doc["kind"] == "Deployment":
            pods[doc["metadata"]["name"]] = doc["spec"]["template"]
        elif doc["kind"] == "Pod":
            pods[doc["metadata"]["name"]] = doc
    return pods


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> openAPIV3Schema of every CRD in the chart's crds/."""
    schemas = {}
    for path in sorted((CHART / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


def dump(docs: Iterable[Manifest]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)})
