"""Flags over the servers' settings classes (pydantic-settings), shared by their commands.

A server's settings class is the one home of each setting: its default, its bounds and its
environment variable (`controller/settings.py`, `gateway/settings.py`). A command's options default
to None and it passes only the flags given (`load_settings`), so the environment fills in the rest,
then the class's defaults; a flag wins over its variable. A bad value, from a flag or a variable,
is a usage error naming where it came from and what the setting is, never a traceback.

pydantic is imported only when a command runs: `sandfleet exec` and friends never load it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import typer

if TYPE_CHECKING:
    from pydantic import ValidationError
    from pydantic_settings import BaseSettings

S = TypeVar("S", bound="BaseSettings")

_FIELD_OF_SOURCE_ERROR = re.compile(r'field "([^"]+)"')


def environment_names(settings: type[BaseSettings]) -> dict[str, tuple[str, ...]]:
    """Each field's environment variables, as pydantic-settings reads them.

    Its aliases, else the class's prefix and its name; upper case (they match case-insensitively).
    """
    from pydantic import AliasChoices

    prefix = settings.model_config.get("env_prefix", "")
    names: dict[str, tuple[str, ...]] = {}
    for name, field in settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            choices = tuple(choice for choice in alias.choices if isinstance(choice, str))
        elif isinstance(alias, str):
            choices = (alias,)
        else:
            choices = (f"{prefix}{name}",)
        names[name] = tuple(choice.upper() for choice in choices)
    return names


def load_settings(settings: type[S], given: Mapping[str, Any], flags: Mapping[str, str] | None = None) -> S:
    """`settings` from the flags given (None: not given) over the environment; BadParameter if bad.

    `flags` names the flag of each field that has one, for the message.
    """
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    passed = {name: value for name, value in given.items() if value is not None}
    try:
        return settings(**passed)
    except ValidationError as error:
        raise typer.BadParameter(describe(error, settings, passed, flags or {})) from None
    except SettingsError as error:  # a list or map variable that is not JSON
        raise typer.BadParameter(unreadable(error, settings, flags or {})) from None


def describe(
    error: ValidationError, settings: type[BaseSettings], passed: Mapping[str, Any], flags: Mapping[str, str]
) -> str:
    """The first problem of `error`: where the value came from, what is wrong, what the setting is."""
    first = error.errors()[0]
    message = str(first["msg"]).removeprefix("Value error, ").rstrip(".")
    if not first["loc"]:
        return message  # a rule across settings: its message names them
    names = environment_names(settings)
    source = str(first["loc"][0])
    field = source if source in settings.model_fields else _field_of(source, names)
    if field is None:
        return f"{source}: {message}"
    if field in passed and source == field:
        value = passed[field]
        flag = flags.get(field, field)
        where = f"{flag} {value}" if isinstance(value, str | int | float) else flag
    else:
        variable = source.upper() if source != field else names[field][0]
        raw = next((v for k, v in os.environ.items() if k.upper() == variable), None)
        where = variable if raw is None else f"{variable}={raw}"
    return f"{where}: {message}. {_what(field, settings, names, flags)}"


def unreadable(error: Exception, settings: type[BaseSettings], flags: Mapping[str, str]) -> str:
    """A variable pydantic-settings could not decode (lists and maps are JSON)."""
    found = _FIELD_OF_SOURCE_ERROR.search(str(error))
    names = environment_names(settings)
    field = found.group(1) if found else None
    if field not in names:
        return str(error)
    return (
        f"{' or '.join(names[field])} is not JSON: lists and maps are written as JSON, e.g. "
        f'\'["a", "b"]\' or \'{{"eu1": "/k/eu1.yaml"}}\'. {_what(field, settings, names, flags)}'
    )


def _field_of(variable: str, names: Mapping[str, tuple[str, ...]]) -> str | None:
    return next((field for field, known in names.items() if variable.upper() in known), None)


def _what(
    field: str, settings: type[BaseSettings], names: Mapping[str, tuple[str, ...]], flags: Mapping[str, str]
) -> str:
    """Where to set `field`, and what it is (its description)."""
    places = ([flags[field]] if field in flags else []) + list(names[field])
    description = settings.model_fields[field].description
    return f"Set {' or '.join(places)}" + (f": {description}" if description else ".")
