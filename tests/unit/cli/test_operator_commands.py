"""`sandfleet operator`: flags win, the environment fills in the rest, bad values are one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import sandfleet.controller.main
from sandfleet.cli import app
from sandfleet.cli.settings_flags import environment_names
from sandfleet.controller.settings import OperatorSettings
from sandfleet.core.agent_tokens import new_fleet_key


@pytest.fixture(autouse=True)
def no_operator_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for names in environment_names(OperatorSettings).values():
        for name in names:
            monkeypatch.delenv(name, raising=False)


def _settings(monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str]) -> OperatorSettings:
    seen: list[OperatorSettings] = []
    monkeypatch.setattr(sandfleet.controller.main, "run", seen.append)
    result = CliRunner().invoke(app, ["operator", *args], env=env)
    assert result.exit_code == 0, result.output
    return seen[0]


def test_without_flags_or_variables_the_settings_defaults_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _settings(monkeypatch, [], {}) == OperatorSettings()


def test_the_environment_configures_what_no_flag_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "SANDFLEET_METRICS_PORT": "9100",
        "SANDFLEET_LEADER_LEASE_SECONDS": "5",
        "SANDFLEET_LEDGER_SHARDS": "8",
        "SANDFLEET_LOG_LEVEL": "warning",
        "SANDFLEET_CLUSTER": "eu1",
        "SANDFLEET_OPERATOR_AGENT_KEY_FILE": "/etc/sandfleet/agent-key/key",
        "SANDFLEET_OPERATOR_RUNTIME_CLASSES": "gvisor,kata",
        "POD_NAMESPACE": "sandfleet",
    }
    settings = _settings(monkeypatch, ["-n", "rl"], env)
    assert settings.namespaces == ("rl",)
    assert (settings.metrics_port, settings.leader_lease_seconds, settings.ledger_shards) == (9100, 5.0, 8)
    assert (settings.log_level, settings.cluster) == ("WARNING", "eu1")
    assert settings.agent_key_file == Path("/etc/sandfleet/agent-key/key")
    assert settings.runtime_classes == {"gvisor", "kata"}
    assert settings.leader_lease_namespace == "sandfleet"


def test_a_flag_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "SANDFLEET_METRICS_PORT": "9100",
        "SANDFLEET_LEADER_LEASE_SECONDS": "5",
        "SANDFLEET_LEDGER_SHARDS": "8",
        "SANDFLEET_CLUSTER": "eu1",
        "SANDFLEET_OPERATOR_AGENT_KEY_FILE": "/env/key",
        "SANDFLEET_OPERATOR_RUNTIME_CLASSES": "kata",
        "SANDFLEET_LEADER_NAMESPACE": "env",
        "SANDFLEET_LOG_LEVEL": "ERROR",
    }
    args = [
        *("--metrics-port", "0", "--leader-lease-seconds", "3", "--ledger-shards", "2"),
        *("--cluster", "us2", "--agent-key-file", "/flag/key", "--leader-namespace", "flag"),
        *("--runtime-class", "gvisor", "--runtime-class", "runc", "--log-level", "DEBUG"),
    ]
    settings = _settings(monkeypatch, args, env)
    assert (settings.metrics_port, settings.leader_lease_seconds, settings.ledger_shards) == (0, 3.0, 2)
    assert (settings.cluster, settings.agent_key_file) == ("us2", Path("/flag/key"))
    assert settings.runtime_classes == {"gvisor", "runc"}
    assert (settings.leader_lease_namespace, settings.log_level) == ("flag", "DEBUG")


def test_the_charts_flags_still_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    # helm/sandfleet/templates/operator.yaml's command line (the chart tests render it for real).
    args = [
        "--namespace=sandfleet",
        "--metrics-port=8080",
        "--leader-lease-seconds=15",
        "--liveness=http://0.0.0.0:8081/healthz",
        "--runtime-class=gvisor",
    ]
    settings = _settings(monkeypatch, args, {"SANDFLEET_LOG_LEVEL": "INFO", "SANDFLEET_CLUSTER": "default"})
    assert settings.namespaces == ("sandfleet",)
    assert settings.liveness == "http://0.0.0.0:8081/healthz"
    assert settings.runtime_classes == {"gvisor"}


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (
            [],
            {"SANDFLEET_LEDGER_SHARDS": "abc"},
            "SANDFLEET_LEDGER_SHARDS=abc: Input should be a valid integer",
        ),
        (
            [],
            {"SANDFLEET_METRICS_PORT": "http"},
            "SANDFLEET_METRICS_PORT=http: Input should be a valid integer",
        ),
        ([], {"SANDFLEET_LOG_LEVEL": "loud"}, "SANDFLEET_LOG_LEVEL=loud"),
        (["--ledger-shards", "0"], {}, "--ledger-shards 0: Input should be greater than or equal to 1"),
        (["--leader-lease-seconds", "0"], {}, "--leader-lease-seconds 0"),
    ],
)
def test_a_bad_value_is_a_usage_error_naming_where_it_came_from(
    monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], said: str
) -> None:
    ran: list[OperatorSettings] = []
    monkeypatch.setattr(sandfleet.controller.main, "run", ran.append)
    result = CliRunner().invoke(app, ["operator", *args], env=env, terminal_width=400)
    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.replace("│", " ").split())  # unboxed and unwrapped
    assert "Traceback" not in result.output
    assert not ran


def test_without_an_agent_key_it_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    result = CliRunner().invoke(app, ["operator", "--metrics-port", "0"])
    assert result.exit_code == 2, result.output
    assert "no agent key: pass --agent-key-file (or SANDFLEET_OPERATOR_AGENT_KEY_FILE)" in result.output
    assert "Traceback" not in result.output


def test_an_unreadable_agent_key_names_its_file(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("not hex")
    result = CliRunner().invoke(app, ["operator"], env={"SANDFLEET_OPERATOR_AGENT_KEY_FILE": str(key)})
    assert result.exit_code == 2, result.output
    assert f"the agent key file {key}" in result.output


def test_the_agent_key_is_read_from_the_file_the_settings_name(tmp_path: Path) -> None:
    key = new_fleet_key()
    path = tmp_path / "key"
    path.write_text(key.hex() + "\n")
    assert (
        sandfleet.controller.main.read_agent_key(OperatorSettings(agent_key_file=path).agent_key_file) == key
    )
