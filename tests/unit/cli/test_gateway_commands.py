"""`sandfleet gateway`: flags win, the SANDFLEET_GATEWAY_* environment fills in the rest."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import sandfleet.gateway.main
from sandfleet.cli import app
from sandfleet.gateway.settings import GatewaySettings


def _settings(monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str]) -> GatewaySettings:
    seen: list[GatewaySettings] = []
    monkeypatch.setattr(sandfleet.gateway.main, "run", lambda settings, *_: seen.append(settings))
    result = CliRunner().invoke(app, ["gateway", *args], env=env)
    assert result.exit_code == 0, result.output
    return seen[0]


def test_the_environment_configures_what_no_flag_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "SANDFLEET_GATEWAY_NAMESPACE": "rl",
        "SANDFLEET_GATEWAY_AUTH": "static",
        "SANDFLEET_GATEWAY_MAX_WAITING": "7",
        "SANDFLEET_GATEWAY_TOKEN_AUDIENCES": '["sandfleet-gateway"]',
    }
    settings = _settings(monkeypatch, [], env)
    assert (settings.namespace, settings.auth, settings.max_waiting) == ("rl", "static", 7)
    assert settings.token_audiences == ["sandfleet-gateway"]
    assert settings.port == 8080


def test_a_flag_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(
        monkeypatch,
        ["--port", "9000", "--token-audience", "a", "--token-audience", "b"],
        {"SANDFLEET_GATEWAY_PORT": "1234"},
    )
    assert settings.port == 9000
    assert settings.token_audiences == ["a", "b"]


def test_a_bad_value_is_a_usage_error_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandfleet.gateway.main, "run", lambda *_: None)
    result = CliRunner().invoke(app, ["gateway", "--auth", "magic"])
    assert result.exit_code == 2
    assert "auth" in result.output
    assert "Traceback" not in result.output


def test_members_are_name_equals_kubeconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(monkeypatch, ["--member", "eu1=/k/eu1.yaml", "--member", "us2=/k/us2.yaml"], {})
    assert {name: str(path) for name, path in settings.members.items()} == {
        "eu1": "/k/eu1.yaml",
        "us2": "/k/us2.yaml",
    }


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("eu1", "NAME=KUBECONFIG"),
        ("=/k/a.yaml", "NAME=KUBECONFIG"),
        ("EU_1=/k/a.yaml", "DNS label"),
    ],
)
def test_a_bad_member_is_a_usage_error_saying_what_to_write(
    monkeypatch: pytest.MonkeyPatch, value: str, said: str
) -> None:
    monkeypatch.setattr(sandfleet.gateway.main, "run", lambda *_: None)
    result = CliRunner().invoke(app, ["gateway", "--member", value], terminal_width=200)
    assert result.exit_code == 2
    assert said in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_a_member_given_twice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandfleet.gateway.main, "run", lambda *_: None)
    result = CliRunner().invoke(app, ["gateway", "--member", "a=/x", "--member", "a=/y"], terminal_width=200)
    assert result.exit_code == 2
    assert "twice" in result.output


def test_member_weights_are_name_equals_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["--member", "eu1=/k/eu1.yaml", "--member", "us2=/k/us2.yaml", "--member-weight", "eu1=2.5"]
    assert _settings(monkeypatch, args, {}).member_weights == {"eu1": 2.5}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--member", "a=/x", "--member-weight", "a"], "NAME=WEIGHT"),
        (["--member", "a=/x", "--member-weight", "a=0"], "above 0"),
        (["--member", "a=/x", "--member-weight", "a=nan"], "above 0"),
        (["--member", "a=/x", "--member-weight", "b=2"], "no --member names"),
    ],
)
def test_a_bad_member_weight_is_a_usage_error_saying_what_to_write(
    monkeypatch: pytest.MonkeyPatch, args: list[str], said: str
) -> None:
    monkeypatch.setattr(sandfleet.gateway.main, "run", lambda *_: None)
    result = CliRunner().invoke(app, ["gateway", *args], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.replace("│", " ").split())  # unboxed and unwrapped
    assert "Traceback" not in result.output


def test_the_cluster_name_is_a_flag_or_the_environment_and_defaults_to_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _settings(monkeypatch, [], {}).cluster == "default"
    assert _settings(monkeypatch, [], {"SANDFLEET_GATEWAY_CLUSTER": "eu1"}).cluster == "eu1"
    assert _settings(monkeypatch, ["--cluster", "us2"], {"SANDFLEET_GATEWAY_CLUSTER": "eu1"}).cluster == "us2"


def test_a_cluster_name_that_no_member_could_have_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandfleet.gateway.main, "run", lambda *_: None)
    result = CliRunner().invoke(app, ["gateway", "--cluster", "EU_1"], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert "DNS label" in " ".join(result.output.replace("│", " ").split())


def test_the_replicas_name_is_the_pods_else_a_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAME", raising=False)
    assert _settings(monkeypatch, [], {}).replica is None
    assert (
        _settings(monkeypatch, [], {"POD_NAME": "sandfleet-gateway-7d9-x2"}).replica
        == "sandfleet-gateway-7d9-x2"
    )
    assert _settings(monkeypatch, ["--replica", "r1"], {"POD_NAME": "pod"}).replica == "r1"


def test_capacity_and_tenancy_come_from_the_environment_and_reach_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[object, ...]] = []
    monkeypatch.setattr(sandfleet.gateway.main, "run", lambda *args: seen.append(args))
    env = {"SANDFLEET_GATEWAY_MAX_GROUP_SIZE": "16", "SANDFLEET_GATEWAY_METRIC_RUNS": "3"}
    result = CliRunner().invoke(app, ["gateway"], env=env)
    assert result.exit_code == 0, result.output
    _, capacity, tenancy = seen[0]
    assert (capacity.max_group_size, tenancy.metric_runs) == (16, 3)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"SANDFLEET_GATEWAY_PORT": "http"}, "SANDFLEET_GATEWAY_PORT=http: Input should be a valid integer"),
        ({"SANDFLEET_GATEWAY_MAX_GROUP_SIZE": "0"}, "SANDFLEET_GATEWAY_MAX_GROUP_SIZE=0"),
        ({"SANDFLEET_GATEWAY_MAX_BODY_BYTES": "lots"}, "SANDFLEET_GATEWAY_MAX_BODY_BYTES=lots"),
    ],
)
def test_a_bad_variable_is_a_usage_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], said: str
) -> None:
    monkeypatch.setattr(sandfleet.gateway.main, "run", lambda *_: None)
    result = CliRunner().invoke(app, ["gateway"], env=env, terminal_width=400)
    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.replace("│", " ").split())
    assert "Traceback" not in result.output
