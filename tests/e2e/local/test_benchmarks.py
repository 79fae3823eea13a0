"""The local-runtime benchmarks run in their short mode in CI and report what they measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandfleet.local.tools import ImageRef

pytestmark = pytest.mark.gvisor

BENCH = Path(__file__).resolve().parents[3] / "bench"


def run_short(script: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, str(BENCH / script), "--short"], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


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
