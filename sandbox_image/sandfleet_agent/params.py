"""Typed readers for JSON request bodies and query strings that fail with a clear 400, never a trace."""

from __future__ import annotations

from collections.abc import Mapping

from sandfleet_agent.errors import bad_request

JsonObject = dict[str, object]


def optional_str(body: Mapping[str, object], key: str) -> str | None:
    """Return a string field, or None when absent or null."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request(f"field {key!r} must be a string")
    return value


def optional_bool(body: Mapping[str, object], key: str) -> bool:
    """Return a boolean field, or False when absent or null."""
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"field {key!r} must be true or false")
    return value


def optional_float(body: Mapping[str, object], key: str, *, minimum: float, maximum: float) -> float | None:
    """Return a number field within bounds, or None when absent or null."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"field {key!r} must be a number")
    if not minimum <= float(value) <= maximum:
        raise bad_request(f"field {key!r} must be between {minimum} and {maximum}")
    return float(value)


def optional_int(body: Mapping[str, object], key: str, *, minimum: int, maximum: int) -> int | None:
    """Return an integer field within bounds, or None when absent or null."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"field {key!r} must be an integer")
    if not minimum <= value <= maximum:
        raise bad_request(f"field {key!r} must be between {minimum} and {maximum}")
    return value


def optional_str_list(body: Mapping[str, object], key: str) -> list[str] | None:
    """Return a list-of-strings field, or None when absent or null."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise bad_request(f"field {key!r} must be a list of strings")
    return [str(item) for item in value]


def optional_str_map(body: Mapping[str, object], key: str) -> dict[str, str] | None:
    """Return a string-to-string object field, or None when absent or null."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise bad_request(f"field {key!r} must be an object of string values")
    return {str(k): str(v) for k, v in value.items()}


def query_flag(query: Mapping[str, str], key: str) -> bool:
    """Read a boolean query parameter: 1/true/yes are true, anything else (or absence) false."""
    return query.get(key, "").lower() in {"1", "true", "yes"}


def query_int(query: Mapping[str, str], key: str, *, default: int, minimum: int, maximum: int) -> int:
    """Read a bounded integer query parameter."""
    raw = query.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(f"query parameter {key!r} must be an integer") from None
    if not minimum <= value <= maximum:
        raise bad_request(f"query parameter {key!r} must be between {minimum} and {maximum}")
    return value


def required_query(query: Mapping[str, str], key: str) -> str:
    """Read a query parameter that must be present and non-empty."""
    value = query.get(key)
    if not value:
        raise bad_request(f"query parameter {key!r} is required")
    return value
