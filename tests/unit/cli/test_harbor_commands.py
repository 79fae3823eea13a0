"""`sandfleet harbor build` over a stand-in buildah: the rewrite it gets, its notes, its errors, exits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sandfleet.cli import app, harbor_commands

BASE = "oci-archive:/cache/base.oci.tar"
# Records the Dockerfile it was given, then succeeds, or fails as buildah does when FAIL is set.
FAKE_BUILDAH = """#!/bin/sh
while [ "$1" != "-f" ]; do shift; done
cp "$2" "$RECORD"
if [ -n "$FAIL" ]; then
  echo 'STEP 2/2: RUN curl -fsSO https://example.com/x'
  echo 'curl: (6) Could not resolve host: example.com'
  echo 'Error: building at STEP "RUN curl -fsSO https://example.com/x": while running runtime: exit status 6'
  exit 1
fi
"""


@pytest.fixture
def task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "task" / "environment").mkdir(parents=True)
    (tmp_path / "task" / "environment" / "Dockerfile").write_text(
        "FROM ubuntu:24.04\nRUN curl -fsSO https://example.com/x\n"
    )
    buildah = tmp_path / "buildah"
    buildah.write_text(FAKE_BUILDAH)
    buildah.chmod(0o755)
    monkeypatch.setenv("RECORD", str(tmp_path / "given"))
    monkeypatch.setattr(harbor_commands, "_reachable", lambda registry, timeout_s: False)
    return tmp_path / "task"


def build(task: Path, *extra: str) -> tuple[int, str, str]:
    runner = CliRunner()
    argv = ["harbor", "build", str(task), "--buildah", str(task.parent / "buildah"), *extra]
    result = runner.invoke(app, argv)
    return result.exit_code, result.stdout, result.stderr


def test_the_build_gets_the_rewritten_from_and_says_so(task: Path) -> None:
    code, out, err = build(task, "--base", BASE, "--out", str(task.parent / "t.oci.tar"))
    assert code == 0, err
    assert (task.parent / "given").read_text().splitlines()[0] == f"FROM {BASE}"
    note = f"FROM ubuntu:24.04 rewritten to FROM {BASE} (docker.io cannot be reached)"
    assert f"harbor build: {note}" in err
    summary = json.loads(out)
    assert summary["image"] == f"oci-archive:{task.parent / 't.oci.tar'}"
    assert summary["notes"] == [note]


def test_a_step_that_needed_the_network_fails_the_build_naming_it(
    task: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIL", "1")
    code, out, err = build(task, "--base", BASE)
    assert code == 1
    assert "harbor build: step 2/2 failed: RUN curl -fsSO https://example.com/x" in err
    assert "it needed the network" in err
    assert out == ""


def test_offline_rewrites_without_probing(task: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def probe(registry: str, timeout_s: float) -> bool:
        raise AssertionError("--offline probes no registry")

    monkeypatch.setattr(harbor_commands, "_reachable", probe)
    code, out, err = build(task, "--base", BASE, "--offline")
    assert code == 0, err
    assert json.loads(out)["notes"] == [f"FROM ubuntu:24.04 rewritten to FROM {BASE} (--offline)"]


def test_no_base_no_dockerfile_no_buildah_are_usage_errors(task: Path, tmp_path: Path) -> None:
    code, _, err = build(task)
    assert (code, "give a local base image" in err) == (2, True)
    code, _, err = build(tmp_path / "nowhere", "--base", BASE)
    assert (code, "cannot read" in err) == (2, True)
    code, _, err = build(task, "--base", BASE, "--buildah", str(tmp_path / "no-buildah"))
    assert (code, "is not installed" in err) == (2, True)
