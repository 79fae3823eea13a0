"""The local-runtime benchmarks run in their short mode in CI and report what they measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandfleet.local.artifacts import ImageRef
from tests.support.bench import run_short

pytestmark = pytest.mark.gvisor


def test_sandbox_cold_short(runsc: Path, base_image: ImageRef) -> None:
    report = run_short("sandbox_cold.py")
    assert report["benchmark"] == "sandbox_cold"
    assert 0 < report["cold_ready_p50_s"] <= report["cold_ready_p99_s"] <= report["cold_ready_max_s"]
    assert report["restore_ready_p50_s"] > 0
    assert report["meets_cold_target"] == (report["cold_ready_p50_s"] <= report["target_cold_ready_p50_s"])


def test_agent_exec_short(runsc: Path, base_image: ImageRef) -> None:
    report = run_short("agent_exec.py")
    assert report["execs"] > 0
    assert 0 < report["exec_true_in_agent_p50_s"] <= report["exec_true_p50_s"]


def test_sandbox_density_short(runsc: Path, base_image: ImageRef) -> None:
    report = run_short("sandbox_density.py")
    assert report["healthy"] == report["sandboxes"]
    assert report["exec_failures"] == 0
    assert report["memory_cgroup_per_sandbox_bytes"] > 0


def test_sandbox_reset_short(runsc: Path, base_image: ImageRef) -> None:
    report = run_short("sandbox_reset.py")
    assert report["benchmark"] == "sandbox_reset"
    assert 0 < report["reset_p50_s"] <= report["reset_p99_s"] <= report["reset_max_s"]
    assert 0 < report["probe_p50_s"] <= report["reset_p50_s"]
    assert report["boot_ready_p50_s"] > 0
    assert report["reset_over_boot_p50"] > 0
