"""Where the local cluster keeps its build modules, cached binaries and running state."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_MODULES = REPO_ROOT / "hack" / "build"
CACHE_ROOT = Path(os.environ.get("SANDFLEET_CACHE", Path.home() / ".cache" / "sandfleet"))
STATE_DIR = Path(os.environ.get("SANDFLEET_CLUSTER_DIR", "/tmp/sandfleet-cluster"))
