"""Runs a benchmark script in its short mode and returns the JSON object it prints last."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_short(script: str, timeout: float = 600) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, str(BENCH / script), "--short"], capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report
