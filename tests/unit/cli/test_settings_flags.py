"""The servers' commands over their settings classes: the chart's variables, the flags, the messages.

Every variable the chart sets for the operator and the gateway must be a setting's (read from the
chart's templates, so a new one without a setting fails here); every setting of a class with flags
has its flag; the defaults a command's help shows are its settings class's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer
from pydantic_settings import BaseSettings, SettingsError
from typer.main import get_command

from sandfleet.cli import app, gateway_commands, operator_commands
from sandfleet.cli.settings_flags import environment_names, load_settings
from sandfleet.controller.settings import OperatorSettings
from sandfleet.gateway.settings import CapacitySettings, GatewaySettings, TenantSettings

TEMPLATES = Path(__file__).resolve().parents[3] / "helm" / "sandfleet" / "templates"

# What each template's server reads its settings with.
SERVERS: dict[str, list[type[BaseSettings]]] = {
    "operator.yaml": [OperatorSettings],
    "gateway.yaml": [GatewaySettings, CapacitySettings, TenantSettings],
}
# Variables the chart sets that are no setting of sandfleet's, and why.
NOT_SETTINGS = {"HOME": "a writable home (the root filesystem is read-only) for the libraries that want one"}

# Each command with flags: its settings class and which field each flag sets.
COMMANDS: dict[str, tuple[type[BaseSettings], dict[str, str]]] = {
    "operator": (OperatorSettings, operator_commands.FLAGS),
    "gateway": (GatewaySettings, gateway_commands.FLAGS),
}

ENV_ITEM = re.compile(r"^\s*-\s+(?:\{\s*)?name:\s*([A-Za-z_][A-Za-z0-9_]*)")


def chart_env_names(template: str) -> set[str]:
    """The names of the `env:` entries of a template's containers, read from the template's text."""
    names: set[str] = set()
    lines = (TEMPLATES / template).read_text().splitlines()
    for number, line in enumerate(lines):
        if line.strip() != "env:":
            continue
        indent = len(line) - len(line.lstrip())
        for entry in lines[number + 1 :]:
            stripped = entry.strip()
            if stripped and len(entry) - len(entry.lstrip()) <= indent and not stripped.startswith("{{"):
                break  # the container's next key
            if found := ENV_ITEM.match(entry):
                names.add(found.group(1))
    return names


def read_by(classes: list[type[BaseSettings]]) -> dict[str, str]:
    """Each variable the classes read, and the setting (class.field) that reads it."""
    return {
        variable: f"{settings.__name__}.{field}"
        for settings in classes
        for field, variables in environment_names(settings).items()
        for variable in variables
    }


@pytest.fixture(autouse=True)
def no_settings_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for classes in SERVERS.values():
        for variable in read_by(classes):
            monkeypatch.delenv(variable, raising=False)


def test_the_chart_reader_finds_the_variables_of_both_templates() -> None:
    # The check below is only as good as this reader: one that read nothing would pass anything.
    assert {"POD_NAMESPACE", "SANDFLEET_LOG_LEVEL", "SANDFLEET_OPERATOR_AGENT_KEY_FILE", "HOME"} <= (
        chart_env_names("operator.yaml")
    )
    assert {"POD_NAME", "SANDFLEET_GATEWAY_AGENT_KEY_FILE", "SANDFLEET_GATEWAY_CLUSTER"} <= (
        chart_env_names("gateway.yaml")
    )
    assert "SANDFLEET_URL" not in chart_env_names("operator.yaml")


@pytest.mark.parametrize("template", sorted(SERVERS))
def test_every_variable_the_chart_sets_is_read_by_a_setting(template: str) -> None:
    unread = chart_env_names(template) - read_by(SERVERS[template]).keys() - NOT_SETTINGS.keys()
    assert not unread, (
        f"helm/sandfleet/templates/{template} sets {sorted(unread)}, which no setting reads: add a "
        f"field to {[c.__name__ for c in SERVERS[template]]} (or, if it is no setting of sandfleet's, "
        "to NOT_SETTINGS)"
    )


@pytest.mark.parametrize(
    ("settings", "field", "variable"),
    [
        (settings, field, variable)
        for classes in SERVERS.values()
        for settings in classes
        for field, variables in environment_names(settings).items()
        for variable in variables
    ],
)
def test_each_variable_the_settings_list_is_read_by_its_field(
    settings: type[BaseSettings], field: str, variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # environment_names says which variables a field reads; pydantic-settings must agree: setting
    # one changes that field, or is refused naming it.
    monkeypatch.setenv(variable, "probe-value")
    read: BaseSettings | None = None
    try:
        read = settings()
    except (SettingsError, ValueError) as error:  # a JSON field's, or a ValidationError
        problem = str(error)
    if read is None:
        assert field in problem or variable in problem, problem
    else:
        assert getattr(read, field) != settings.model_fields[field].default


def options(command: str) -> dict[str, Any]:
    """A command's options by each of their flags."""
    group: Any = get_command(app)
    found = group.commands[command].params
    return {flag: p for p in found if p.param_type_name == "option" for flag in [*p.opts, *p.secondary_opts]}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_setting_has_its_flag(command: str) -> None:
    settings, flags = COMMANDS[command]
    assert flags.keys() == settings.model_fields.keys()
    missing = {field: flag for field, flag in flags.items() if flag not in options(command)}
    assert not missing, f"`sandfleet {command}` lacks the flags {missing}"


def shown(default: Any) -> str | None:
    """How a help text writes a default; None where it is prose (none, empty, a switch)."""
    if default is None or isinstance(default, bool):
        return None
    if isinstance(default, float):
        return f"{default:g}"
    if isinstance(default, str | int):
        return str(default)
    if isinstance(default, tuple | list | set | frozenset) and default:
        return ", ".join(sorted(default))
    return None


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_defaults_the_help_shows_are_the_settings(command: str) -> None:
    # The options default to None (the environment fills them in), so the help is told the default
    # (show_default): it must be the settings class's, the one home of each default.
    settings, flags = COMMANDS[command]
    by_flag = options(command)
    for field, flag in flags.items():
        default = shown(settings.model_fields[field].default)
        if default is not None:
            assert by_flag[flag].show_default == default, (command, flag)


def test_the_operators_help_names_every_variable() -> None:
    group: Any = get_command(app)
    help_text = " ".join((group.commands["operator"].help or "").split())
    for variables in environment_names(OperatorSettings).values():
        assert any(variable in help_text for variable in variables), variables


def test_only_the_flags_given_are_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFLEET_METRICS_PORT", "9100")
    settings = load_settings(OperatorSettings, {"metrics_port": None, "ledger_shards": 4})
    assert (settings.metrics_port, settings.ledger_shards) == (9100, 4)


def message(error: pytest.ExceptionInfo[typer.BadParameter]) -> str:
    return str(error.value.message)


def test_a_bad_variable_is_named_with_its_value_and_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFLEET_LEDGER_SHARDS", "abc")
    with pytest.raises(typer.BadParameter) as error:
        load_settings(OperatorSettings, {}, operator_commands.FLAGS)
    said = message(error)
    assert said.startswith("SANDFLEET_LEDGER_SHARDS=abc: Input should be a valid integer")
    assert "Set --ledger-shards or SANDFLEET_LEDGER_SHARDS: Ledger shards" in said


def test_a_bad_aliased_variable_is_named_as_it_was_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFLEET_OPERATOR_RUNTIME_CLASSES", ",")
    with pytest.raises(typer.BadParameter) as error:
        load_settings(OperatorSettings, {})
    assert message(error).startswith("SANDFLEET_OPERATOR_RUNTIME_CLASSES=,: name at least one RuntimeClass")


def test_a_bad_flag_is_named_with_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFLEET_METRICS_PORT", "9100")  # the flag's value is the bad one
    with pytest.raises(typer.BadParameter) as error:
        load_settings(OperatorSettings, {"metrics_port": 70000}, operator_commands.FLAGS)
    assert message(error).startswith("--metrics-port 70000: Input should be less than or equal to 65535")


def test_a_variable_that_is_not_json_says_how_to_write_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFLEET_GATEWAY_TOKEN_AUDIENCES", "a,b")
    with pytest.raises(typer.BadParameter) as error:
        load_settings(GatewaySettings, {}, gateway_commands.FLAGS)
    said = message(error)
    assert said.startswith("SANDFLEET_GATEWAY_TOKEN_AUDIENCES is not JSON")
    assert "--token-audience" in said


def test_a_bad_variable_without_a_flag_names_the_variable_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFLEET_GATEWAY_MAX_BODY_BYTES", "12")
    with pytest.raises(typer.BadParameter) as error:
        load_settings(TenantSettings, {})
    said = message(error)
    assert said.startswith(
        "SANDFLEET_GATEWAY_MAX_BODY_BYTES=12: Input should be greater than or equal to 1024"
    )
    assert "Set SANDFLEET_GATEWAY_MAX_BODY_BYTES: Body cap" in said


def test_a_rule_across_settings_keeps_its_own_message() -> None:
    with pytest.raises(typer.BadParameter) as error:
        load_settings(GatewaySettings, {"member_weights": {"eu1": 2.0}}, gateway_commands.FLAGS)
    assert message(error) == "member_weights names 'eu1', which no --member names: give it one"


def test_the_operators_page_lists_every_variable() -> None:
    page = (TEMPLATES.parents[2] / "docs" / "operator.md").read_text()
    missing = [names for names in environment_names(OperatorSettings).values() if names[0] not in page]
    assert not missing, f"docs/operator.md (Running) lacks {missing}"
