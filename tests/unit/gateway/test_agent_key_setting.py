"""`sandfleet gateway` needs the fleet key agents' tokens derive from, or an explicit insecure flag."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sandfleet.cli import app
from sandfleet.core.agent_tokens import AgentKeyError
from sandfleet.gateway.main import load_agent_key
from sandfleet.gateway.settings import GatewaySettings


def test_the_key_file_is_read(tmp_path: Path) -> None:
    key = secrets.token_hex(32)
    (tmp_path / "key").write_text(key + "\n")
    assert load_agent_key(GatewaySettings(agent_key_file=tmp_path / "key")) == bytes.fromhex(key)


def test_no_key_is_refused_unless_insecure_is_asked_for() -> None:
    with pytest.raises(AgentKeyError, match="--agent-key-file"):
        load_agent_key(GatewaySettings())
    assert load_agent_key(GatewaySettings(insecure_no_agent_key=True)) is None


def test_a_short_or_missing_key_is_a_clear_usage_error(tmp_path: Path) -> None:
    (tmp_path / "short").write_text("abc\n")
    for path, message in ((tmp_path / "short", "at least 32"), (tmp_path / "none", "cannot read")):
        result = CliRunner().invoke(app, ["gateway", "--agent-key-file", str(path)], env={})
        assert result.exit_code == 2
        assert message in result.output
        assert "Traceback" not in result.output
    result = CliRunner().invoke(app, ["gateway"], env={})
    assert result.exit_code == 2
    assert "no agent key" in result.output
