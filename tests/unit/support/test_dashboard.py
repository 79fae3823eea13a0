"""Reading a Grafana dashboard's queries: nested rows, label_values() variables, variable substitution."""

from __future__ import annotations

import pytest

from tests.support.dashboard import (
    PanelQuery,
    VariableQuery,
    every_expr,
    panel_queries,
    substitute,
    variable_queries,
)

BOARD = {
    "templating": {
        "list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus"},
            {"name": "pool", "type": "query", "query": {"query": "label_values(up, pool)", "refId": "p"}},
            {"name": "region", "type": "query", "query": 'label_values(m{pool=~"$pool",a="b"}, region)'},
            {"name": "any", "type": "query", "query": "label_values(job)"},
            {"name": "fixed", "type": "custom", "query": "a,b"},
        ]
    },
    "panels": [
        {"type": "row", "title": "Open", "panels": []},
        {"type": "timeseries", "title": "A", "targets": [{"expr": "up", "refId": "A"}, {"refId": "B"}]},
        {
            "type": "row",
            "title": "Collapsed",
            "panels": [{"type": "stat", "title": "B", "targets": [{"expr": "x", "legendFormat": "x"}]}],
        },
        {"type": "text", "title": "notes"},
    ],
}


def test_every_panel_query_is_found_with_its_row_nested_ones_included() -> None:
    assert panel_queries(BOARD) == [PanelQuery("Open / A", "A", "up"), PanelQuery("Collapsed / B", "x", "x")]


def test_every_expr_finds_them_however_deep() -> None:
    assert sorted(every_expr(BOARD)) == ["up", "x"]
    assert every_expr({"a": [{"b": {"expr": "deep"}}], "expr": ""}) == ["deep"]


def test_label_values_variables_are_read_and_other_kinds_left_alone() -> None:
    assert variable_queries(BOARD) == [
        VariableQuery("pool", "pool", "up"),
        VariableQuery("region", "region", 'm{pool=~"$pool",a="b"}'),
        VariableQuery("any", "job", ""),
    ]


def test_a_variable_query_other_than_label_values_is_an_error() -> None:
    board = {"templating": {"list": [{"name": "v", "type": "query", "query": "query_result(up)"}]}}
    with pytest.raises(ValueError, match="'v'"):
        variable_queries(board)


def test_every_form_of_variable_is_substituted() -> None:
    expr = 'rate(m{pool=~"$pool",region=~"${region}",run=~"${run:regex}",x="[[x]]"}[$__rate_interval])'
    values = {"pool": "p", "region": ".*", "run": "r", "x": "1", "__rate_interval": "1m"}
    assert substitute(expr, values) == 'rate(m{pool=~"p",region=~".*",run=~"r",x="1"}[1m])'
    assert substitute('m{a=~"b$"}', {}) == 'm{a=~"b$"}'  # a regex anchor is no variable


def test_a_variable_without_a_value_is_named() -> None:
    with pytest.raises(ValueError, match="pool, region"):
        substitute('m{pool=~"$pool",region=~"$region"}', {})
