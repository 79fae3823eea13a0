"""Every example manifest validates against its canonical CRD schema (offline; CEL runs server-side)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> openAPIV3Schema for every CRD under manifests/crds/."""
    schemas = {}
    for path in sorted((REPO / "manifests" / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


def examples() -> list[Path]:
    return sorted((REPO / "manifests" / "examples").glob("*.yaml"))


def test_there_are_crds_and_examples() -> None:
    assert crd_schemas()
    assert examples()


@pytest.mark.parametrize("path", examples(), ids=lambda p: p.name)
def test_example_matches_its_crd_schema(path: Path) -> None:
    schemas = crd_schemas()
    for document in yaml.safe_load_all(path.read_text()):
        key = (document["apiVersion"], document["kind"])
        assert key in schemas, f"{path.name}: no CRD under manifests/crds/ defines {key}"
        jsonschema.validate(document, schemas[key])


def test_schema_check_catches_a_broken_example() -> None:
    schema = crd_schemas()[("sandfleet.dev/v1alpha1", "SandboxPool")]
    broken = yaml.safe_load(examples()[0].read_text())
    broken["spec"]["regions"][0]["weight"] = 0
    with pytest.raises(jsonschema.ValidationError, match="less than the minimum of 1"):
        jsonschema.validate(broken, schema)
