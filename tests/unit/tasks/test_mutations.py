"""The mutation operators: every mutant parses, is a real change of one node, and its edit reproduces it."""

from __future__ import annotations

import ast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandfleet.tasks.mutations import OPERATORS, Mutant, edit_anchor, mutants

NAMES = st.sampled_from(["a", "b", "items", "n"])
ATOMS = st.one_of(NAMES, st.integers(-3, 300).map(str), st.sampled_from(["True", "False", "None"]))


def _expressions() -> st.SearchStrategy[str]:
    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, st.sampled_from(["+", "-", "*", "//", "%", "&", "|", "<<"]), inner).map(
                lambda t: f"({t[0]} {t[1]} {t[2]})"
            ),
            st.tuples(inner, st.sampled_from(["<", "<=", ">", ">=", "==", "!=", "in", "is not"]), inner).map(
                lambda t: f"({t[0]} {t[1]} {t[2]})"
            ),
            st.tuples(inner, st.sampled_from(["and", "or"]), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
            inner.map(lambda e: f"(not {e})"),
            st.tuples(NAMES, inner, inner).map(lambda t: f"f({t[0]}, {t[1]}, {t[2]})"),
            st.tuples(NAMES, inner).map(lambda t: f"{t[0]}[{t[1]}:]"),
            st.tuples(NAMES, st.integers(0, 5)).map(lambda t: f"{t[0]}[:{t[1]}]"),
        )

    return st.recursive(ATOMS, extend, max_leaves=6)


@st.composite
def modules(draw: st.DrawFn) -> str:
    """A module of one or two functions with assignments, ifs (some with else) and returns."""
    lines = ["import os", "LIMIT = 10", ""]
    for index in range(draw(st.integers(1, 2))):
        lines.append(f"def g{index}(a, b, items, n):")
        for _ in range(draw(st.integers(1, 4))):
            kind = draw(st.sampled_from(["assign", "if", "ifelse", "return"]))
            expr = draw(_expressions())
            if kind == "assign":
                lines.append(f"    n = {expr}")
            elif kind == "return":
                lines.append(f"    return {expr}")
            else:
                lines += [f"    if {expr}:", f"        a = {draw(_expressions())}"]
                if kind == "ifelse":
                    lines += ["    else:", f"        b = {draw(_expressions())}"]
        lines.append("    return n")
        lines.append("")
    return "\n".join(lines)


@settings(max_examples=60, deadline=None)
@given(modules())
def test_every_mutant_parses_and_changes_exactly_one_top_level_statement(source: str) -> None:
    original = ast.parse(source)
    for mutant in mutants(source):
        tree = ast.parse(mutant.source)  # parses, or this raises
        assert ast.dump(tree) != ast.dump(original), mutant
        assert mutant.operator in OPERATORS
        pairs = zip(tree.body, original.body, strict=True)
        changed = [i for i, (x, y) in enumerate(pairs) if ast.dump(x) != ast.dump(y)]
        assert len(tree.body) == len(original.body), mutant
        assert len(changed) == 1, mutant


@settings(max_examples=60, deadline=None)
@given(modules())
def test_each_mutants_edit_is_unique_and_reproduces_it(source: str) -> None:
    for mutant in mutants(source):
        find, replace = edit_anchor(source, mutant.source)
        assert source.count(find) == 1
        assert source.replace(find, replace) == mutant.source
        # ... and undone from the mutant (a fix), which needs `replace` once and not empty.
        assert replace
        assert mutant.source.count(replace) == 1
        assert mutant.source.replace(replace, find) == source


@settings(max_examples=60, deadline=None)
@given(modules())
def test_restricting_to_lines_yields_only_mutants_starting_there(source: str) -> None:
    everything = list(mutants(source))
    lines = frozenset(m.line for m in everything[::2])
    restricted = list(mutants(source, lines))
    assert {m.line for m in restricted} <= lines
    assert {m.source for m in restricted} == {m.source for m in everything if m.line in lines}


def _by_operator(source: str) -> dict[str, list[Mutant]]:
    found: dict[str, list[Mutant]] = {}
    for mutant in mutants(source):
        found.setdefault(mutant.operator, []).append(mutant)
    return found


def test_each_operator_makes_the_change_it_names() -> None:
    source = (
        "def h(xs, lo, hi, flag=False):\n"
        "    if lo < hi and not flag:\n"
        "        return xs[lo:hi]\n"
        "    else:\n"
        "        return max(lo + 1, hi)\n"
    )
    found = _by_operator(source)
    assert set(found) == set(OPERATORS)
    texts = {op: {m.source for m in ms} for op, ms in found.items()}
    assert any("lo >= hi" in t for t in texts["compare_negate"])
    assert any("lo <= hi" in t for t in texts["compare_boundary"])
    assert any("lo < hi or not flag" in t for t in texts["boolop_swap"])
    assert any("and flag:" in t for t in texts["drop_not"])
    assert any("xs[lo + 1:hi]" in t or "xs[lo:hi + 1]" in t for t in texts["off_by_one"])
    assert any("lo - 1" in t for t in texts["arith_swap"])
    assert any("max(hi, lo + 1)" in t for t in texts["swap_args"])
    assert any("else" not in t for t in texts["drop_else"])


def test_docstrings_annotations_and_type_checking_guards_are_not_mutated() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import os\n"
        "def k(x: int = 1) -> bool:\n"
        '    """Doc."""\n'
        "    y: int = 3\n"
        "    return True\n"
    )
    lines = {m.line for m in mutants(source)}
    assert lines == {4, 6, 7}  # the default 1, the value 3, the True; not the guard, docstring or types
    assert all("TYPE_CHECKING" in m.source.splitlines()[1] for m in mutants(source))


def test_a_module_that_does_not_parse_has_no_mutants() -> None:
    assert list(mutants("def broken(:\n")) == []


def test_equal_texts_have_no_edit() -> None:
    with pytest.raises(ValueError, match="no edit"):
        edit_anchor("a = 1\n", "a = 1\n")


def test_a_dropped_else_still_has_an_edit_both_ways() -> None:
    source = "def f(x):\n    if x:\n        y = 1\n    else:\n        y = 2\n    return y\n"
    (dropped,) = [m for m in mutants(source) if m.operator == "drop_else"]
    find, replace = edit_anchor(source, dropped.source)
    assert replace
    assert dropped.source.replace(replace, find) == source
