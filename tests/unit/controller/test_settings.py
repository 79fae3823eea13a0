"""Operator settings: every variable the operator was ever configured by still reads, defaults, bounds."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from sandfleet.cli.settings_flags import environment_names
from sandfleet.controller.settings import OperatorSettings
from sandfleet.core.api import DEFAULT_CLUSTER, DEFAULT_RUNTIME_CLASS
from sandfleet.core.ledger import DEFAULT_SHARDS, MAX_SHARDS

# Each variable the operator read before its settings were a class (by hand, or through typer's
# envvar=), with a value and what the field becomes: none may stop working.
LEGACY = {
    "SANDFLEET_LEADER_NAMESPACE": ("leader_namespace", "leaders", "leaders"),
    "POD_NAMESPACE": ("leader_namespace", "sandfleet", "sandfleet"),
    "SANDFLEET_LOG_LEVEL": ("log_level", "DEBUG", "DEBUG"),
    "SANDFLEET_METRICS_PORT": ("metrics_port", "9100", 9100),
    "SANDFLEET_LEADER_LEASE_SECONDS": ("leader_lease_seconds", "3", 3.0),
    "SANDFLEET_LEDGER_SHARDS": ("ledger_shards", "8", 8),
    "SANDFLEET_OPERATOR_AGENT_KEY_FILE": ("agent_key_file", "/etc/key", Path("/etc/key")),
    "SANDFLEET_OPERATOR_RUNTIME_CLASSES": ("runtime_classes", "gvisor,kata", frozenset({"gvisor", "kata"})),
    "SANDFLEET_CLUSTER": ("cluster", "eu1", "eu1"),
}


@pytest.fixture(autouse=True)
def no_operator_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for names in environment_names(OperatorSettings).values():
        for name in names:
            monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("variable", sorted(LEGACY))
def test_each_variable_the_operator_read_by_hand_still_reads(
    variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    field, value, expected = LEGACY[variable]
    monkeypatch.setenv(variable, value)
    assert getattr(OperatorSettings(), field) == expected
    assert variable in environment_names(OperatorSettings)[field]


def test_the_defaults_are_what_the_operator_ran_with() -> None:
    settings = OperatorSettings()
    assert settings.namespaces == ()
    assert settings.leader_namespace is None
    assert settings.leader_lease_seconds == 15.0
    assert settings.metrics_port == 8080
    assert settings.liveness is None
    assert settings.agent_key_file is None
    assert settings.runtime_classes == frozenset({DEFAULT_RUNTIME_CLASS})
    assert settings.cluster == DEFAULT_CLUSTER
    assert settings.log_level == "INFO"
    assert settings.ledger_shards == DEFAULT_SHARDS


def test_the_leader_lease_lives_in_the_named_namespace_else_the_pods_else_the_first_watched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert OperatorSettings().leader_lease_namespace == "default"
    assert OperatorSettings(namespaces=("a", "b")).leader_lease_namespace == "a"
    monkeypatch.setenv("POD_NAMESPACE", "own")
    assert OperatorSettings(namespaces=("a",)).leader_lease_namespace == "own"
    monkeypatch.setenv("SANDFLEET_LEADER_NAMESPACE", "named")
    assert OperatorSettings(namespaces=("a",)).leader_lease_namespace == "named"
    assert OperatorSettings(leader_namespace="given").leader_lease_namespace == "given"


def test_an_empty_variable_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    # As when read by hand with `or`: an empty SANDFLEET_LEADER_NAMESPACE falls back to POD_NAMESPACE.
    monkeypatch.setenv("SANDFLEET_LEADER_NAMESPACE", "")
    monkeypatch.setenv("POD_NAMESPACE", "own")
    monkeypatch.setenv("SANDFLEET_METRICS_PORT", "")
    settings = OperatorSettings()
    assert (settings.leader_namespace, settings.metrics_port) == ("own", 8080)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("kata", {"kata"}),
        ("gvisor,kata", {"gvisor", "kata"}),
        ("gvisor kata", {"gvisor", "kata"}),  # what typer's envvar= split repeated options on
        ('["gvisor", "kata"]', {"gvisor", "kata"}),
    ],
)
def test_runtime_classes_are_comma_or_space_separated_or_json(
    value: str, expected: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDFLEET_OPERATOR_RUNTIME_CLASSES", value)
    assert OperatorSettings().runtime_classes == expected


def test_repeated_flags_may_each_hold_several_names() -> None:
    settings = OperatorSettings(runtime_classes=["gvisor,kata", "runc"], namespaces=["a", "b,c"])
    assert settings.runtime_classes == {"gvisor", "kata", "runc"}
    assert settings.namespaces == ("a", "b", "c")


def test_namespaces_come_from_a_variable_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFLEET_NAMESPACES", "rl,eval")
    assert OperatorSettings().namespaces == ("rl", "eval")


def test_the_log_level_is_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFLEET_LOG_LEVEL", "debug")
    assert OperatorSettings().log_level == "DEBUG"


def test_other_sandfleet_variables_are_not_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # The RL Pods' and the client's variables share the prefix; the operator ignores them.
    monkeypatch.setenv("SANDFLEET_URL", "http://gateway")
    monkeypatch.setenv("SANDFLEET_GATEWAY_PORT", "9")
    assert OperatorSettings() == OperatorSettings()


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("SANDFLEET_LEDGER_SHARDS", "abc", "valid integer"),
        ("SANDFLEET_LEDGER_SHARDS", "0", "greater than or equal to 1"),
        ("SANDFLEET_LEDGER_SHARDS", str(MAX_SHARDS + 1), f"less than or equal to {MAX_SHARDS}"),
        ("SANDFLEET_METRICS_PORT", "70000", "less than or equal to 65535"),
        ("SANDFLEET_LEADER_LEASE_SECONDS", "0", "greater than 0"),
        ("SANDFLEET_LOG_LEVEL", "loud", "'DEBUG', 'INFO'"),
        ("SANDFLEET_OPERATOR_RUNTIME_CLASSES", ",", "at least one RuntimeClass"),
        ("SANDFLEET_NAMESPACES", "[rl", "not a JSON list"),
    ],
)
def test_a_bad_value_is_refused_by_the_class(
    variable: str, value: str, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError, match=said):
        OperatorSettings()


def test_the_settings_are_frozen() -> None:
    with pytest.raises(ValidationError):
        OperatorSettings().ledger_shards = 3  # type: ignore[misc]
