"""Fetching what tasks are built from: pinned sdists and wheels, by `pip download`, into a cache."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# pytest and its own dependencies, as wheels: the image has no pip and no network, so they travel
# in the task image's /workspace/.deps (and mining runs the tests with the same ones).
TEST_WHEELS = ("pytest==8.3.4", "pluggy==1.5.0", "iniconfig==2.0.0", "packaging==24.2")


class TaskBuildError(RuntimeError):
    """Reading the catalogue, or fetching and building the tasks, failed; the message says why."""


def pip_download(args: list[str], dest: Path) -> None:
    """`pip download --no-deps args` into `dest`; TaskBuildError with pip's own words if it fails."""
    dest.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--dest", str(dest), *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        raise TaskBuildError(f"pip download {' '.join(args)} failed: {result.stderr.strip()[-800:]}")
