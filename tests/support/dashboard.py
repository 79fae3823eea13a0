"""A Grafana dashboard's queries, read from its JSON: each panel's PromQL, each variable's label_values()."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# $name, ${name}, ${name:format} and the deprecated [[name]]: every form Grafana expands.
VARIABLE = re.compile(r"\$\{(\w+)(?::[\w]+)?\}|\[\[(\w+)\]\]|\$(\w+)")
LABEL_VALUES = re.compile(
    r"^\s*label_values\(\s*(?:(?P<match>.+?)\s*,\s*)?(?P<label>\w+)\s*\)\s*$", re.DOTALL
)


@dataclass(frozen=True)
class PanelQuery:
    """One target of one panel: where it is drawn (row / panel title) and its PromQL."""

    where: str
    ref: str
    expr: str


@dataclass(frozen=True)
class VariableQuery:
    """A template variable filled by `label_values(match, label)`."""

    name: str
    label: str
    match: str  # a series selector; empty when the variable asks for the label on every series


def panels(board: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every panel with the row it sits under, collapsed rows' nested panels included."""
    row = ""
    for panel in board.get("panels") or ():
        if panel.get("type") == "row":
            row = panel.get("title", "")
            for nested in panel.get("panels") or ():
                yield row, nested
        yield row, panel


def panel_queries(board: Mapping[str, Any]) -> list[PanelQuery]:
    """Every PromQL expression a panel asks for (a target without `expr` is no Prometheus query)."""
    found = []
    for row, panel in panels(board):
        where = f"{row} / {panel.get('title', '?')}" if row else str(panel.get("title", "?"))
        for index, target in enumerate(panel.get("targets") or ()):
            if target.get("expr"):
                ref = str(target.get("refId") or target.get("legendFormat") or index)
                found.append(PanelQuery(where, ref, str(target["expr"])))
    return found


def every_expr(node: object) -> list[str]:
    """Every `expr` anywhere in the JSON, however nested: what panel_queries() must not miss."""
    if isinstance(node, Mapping):
        own = [str(node["expr"])] if node.get("expr") else []
        return own + [e for key, value in node.items() if key != "expr" for e in every_expr(value)]
    if isinstance(node, list):
        return [e for item in node for e in every_expr(item)]
    return []


def variable_queries(board: Mapping[str, Any]) -> list[VariableQuery]:
    """The dashboard's query variables; one Grafana function other than label_values() is an error."""
    found = []
    for variable in (board.get("templating") or {}).get("list") or ():
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, Mapping) else str(query or "")
        parsed = LABEL_VALUES.match(text)
        if parsed is None:
            raise ValueError(f"variable {variable.get('name')!r}: cannot read {text!r} (only label_values())")
        found.append(VariableQuery(str(variable["name"]), parsed["label"], parsed["match"] or ""))
    return found


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """`expr` with every variable replaced by its value; one with no value is a ValueError naming it."""
    unknown = sorted({next(g for g in m.groups() if g) for m in VARIABLE.finditer(expr)} - set(values))
    if unknown:
        raise ValueError(f"{expr!r} uses variables nobody gave a value for: {', '.join(unknown)}")
    return VARIABLE.sub(lambda m: values[next(g for g in m.groups() if g)], expr)
