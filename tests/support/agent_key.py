"""A fleet key file for test processes: the operator puts tokens derived from it into sandbox Pods."""

from __future__ import annotations

import secrets
from pathlib import Path

OPERATOR_KEY_ENV = "SANDFLEET_OPERATOR_AGENT_KEY_FILE"


def fleet_key_file(directory: Path) -> Path:
    """`directory`/agent-key holding a fresh hex fleet key (kept if already there: one key per directory)."""
    path = directory / "agent-key"
    if not path.exists():
        path.write_text(secrets.token_hex(32) + "\n")
        path.chmod(0o600)
    return path
