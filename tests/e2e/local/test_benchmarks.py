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


def test_image_cold_start_short(runsc: Path, base_image: ImageRef) -> None:
    """busybox and the base image from the local registry: every phase measured, the ratios consistent."""
    report = run_short("image_cold_start.py")
    assert report["benchmark"] == "image_cold"
    images = report["images"]
    assert set(images) == {"busybox", "base", "base, injected"}
    for name in ("busybox", "base"):
        row = images[name]
        for phase in (
            "pull",
            "skopeo_copy",
            "unpack",
            "umoci_unpack",
            "first_boot",
            "first_ready",
            "boot",
            "ready",
        ):
            assert row[f"{phase}_p50_s"] > 0, (name, phase, row)
        phases = sum(row[f"{phase}_p50_s"] for phase in ("pull", "unpack", "first_boot", "first_ready"))
        assert abs(row["cold_start_p50_s"] - phases) < 0.01, row
        assert row["pull_over_skopeo"] > 0
        assert row["unpack_over_umoci"] > 0
        assert row["unpacked_bytes"] > row["size_bytes"] > 0
    assert images["busybox"]["size_bytes"] < images["base"]["size_bytes"]
    assert images["base"]["boot_ready_over_base"] == 1.0
    assert images["busybox"]["boot_ready_over_base"] > 0
    assert images["base, injected"]["boot_ready_over_base"] > 0


def test_scoring_speed_short(runsc: Path, base_image: ImageRef) -> None:
    """tasks/ci.yaml's tasks scored in gVisor and on the host: every phase measured, ratios consistent."""
    report = run_short("scoring_speed.py")
    assert report["benchmark"] == "scoring_speed"
    assert report["tasks"] == len(report["rows"]) == 3
    for row in report["rows"]:
        for side in ("host", "gvisor"):
            phases = row[side]
            assert phases["score_s"] >= phases["runner_s"] > 0, (side, phases)
            assert 0 < phases["startup_s"] < phases["runner_s"]
            assert phases["tests_s"] > 0
            assert phases["startup_uncompiled_s"] > 0
        assert row["runner_ratio"] == row["gvisor"]["runner_s"] / row["host"]["runner_s"]
    assert 0 < report["score_ratio_p50"] <= report["score_ratio_p90"]
    assert report["meets_targets"] == (
        report["score_ratio_p50"] <= report["target_score_ratio_p50"]
        and report["score_ratio_p90"] <= report["target_score_ratio_p90"]
    )
