"""AST mutation operators: source text in, mutants (each one real, parseable change) out; no I/O."""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass

# A comparison's negation, and its boundary shift (the off-by-one of a comparison).
_NEGATE: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_BOUNDARY: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
}
_ARITHMETIC: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
    ast.LShift: ast.RShift,
    ast.RShift: ast.LShift,
}


@dataclass(frozen=True)
class Mutant:
    """One change to one module: where, which operator, and the whole mutated source."""

    operator: str
    line: int
    end_line: int
    description: str
    source: str


Rewrite = tuple[str, str, ast.AST]  # operator name, description, the replacement node
_Rule = Callable[[ast.AST], Iterator[Rewrite]]


def _compare(node: ast.AST) -> Iterator[Rewrite]:
    if not isinstance(node, ast.Compare) or len(node.ops) != 1:
        return
    op = type(node.ops[0])
    for name, table in (("compare_negate", _NEGATE), ("compare_boundary", _BOUNDARY)):
        if op in table:
            new = copy.deepcopy(node)
            new.ops = [table[op]()]
            yield name, f"{op.__name__} -> {table[op].__name__}", new


def _constant(node: ast.AST) -> Iterator[Rewrite]:
    if not isinstance(node, ast.Constant):
        return
    value = node.value
    if isinstance(value, bool):
        yield "bool_flip", f"{value} -> {not value}", ast.Constant(value=not value)
    elif isinstance(value, int):
        yield "off_by_one", f"{value} -> {value + 1}", ast.Constant(value=value + 1)
        if value > 0:
            yield "off_by_one", f"{value} -> {value - 1}", ast.Constant(value=value - 1)


def _slice(node: ast.AST) -> Iterator[Rewrite]:
    # A slice bound that is a name or expression (constants are already covered) gains a +1.
    if not isinstance(node, ast.Slice):
        return
    for field in ("lower", "upper"):
        bound = getattr(node, field)
        if bound is not None and not isinstance(bound, ast.Constant):
            new = copy.deepcopy(node)
            setattr(new, field, ast.BinOp(left=copy.deepcopy(bound), op=ast.Add(), right=ast.Constant(1)))
            yield "off_by_one", f"slice {field} + 1", new


def _boolop(node: ast.AST) -> Iterator[Rewrite]:
    if isinstance(node, ast.BoolOp):
        new = copy.deepcopy(node)
        new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield "boolop_swap", f"{type(node.op).__name__} -> {type(new.op).__name__}", new
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield "drop_not", "not x -> x", copy.deepcopy(node.operand)


def _arithmetic(node: ast.AST) -> Iterator[Rewrite]:
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        new = copy.deepcopy(node)
        new.op = _ARITHMETIC[type(node.op)]()
        yield "arith_swap", f"{type(node.op).__name__} -> {type(new.op).__name__}", new


def _swap_arguments(node: ast.AST) -> Iterator[Rewrite]:
    if not isinstance(node, ast.Call) or len(node.args) < 2:
        return
    first, second = node.args[0], node.args[1]
    if any(isinstance(a, ast.Starred) for a in (first, second)) or ast.dump(first) == ast.dump(second):
        return
    new = copy.deepcopy(node)
    new.args[0], new.args[1] = new.args[1], new.args[0]
    yield "swap_args", "first two arguments swapped", new


def _branch(node: ast.AST) -> Iterator[Rewrite]:
    if not isinstance(node, ast.If):
        return
    if node.orelse:
        new = copy.deepcopy(node)
        new.orelse = []
        yield "drop_else", "else branch dropped", new
    new = copy.deepcopy(node)
    new.body = [ast.Pass()]
    yield "drop_branch", "if body replaced by pass", new


RULES: tuple[_Rule, ...] = (_compare, _constant, _slice, _boolop, _arithmetic, _swap_arguments, _branch)
OPERATORS = (
    "compare_negate",
    "compare_boundary",
    "bool_flip",
    "off_by_one",
    "boolop_swap",
    "drop_not",
    "arith_swap",
    "swap_args",
    "drop_else",
    "drop_branch",
)


def _skipped(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Docstrings, annotations and `if TYPE_CHECKING` / `__main__` guards give no behavioural mutant."""
    parent = parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.arg | ast.AnnAssign) and node is not getattr(parent, "value", None):
            return True
        parent = parents.get(parent)
    if isinstance(node, ast.Constant) and isinstance(parents.get(node), ast.Expr):
        return True
    if isinstance(node, ast.If):
        text = ast.unparse(node.test)
        return "TYPE_CHECKING" in text or "__name__" in text
    return False


def _offsets(source: str) -> list[int]:
    """The character offset at which each line starts (1-based line numbers index it)."""
    starts = [0, 0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def _position(node: ast.AST) -> tuple[int, int, int, int]:
    """(line, column, end line, end column) of a node that has a position."""
    line, column = int(getattr(node, "lineno", 1)), int(getattr(node, "col_offset", 0))
    end_line = getattr(node, "end_lineno", None) or line
    end_column = getattr(node, "end_col_offset", None) or 0
    return line, column, int(end_line), int(end_column)


def _replace(source: str, starts: list[int], node: ast.AST, text: str) -> str:
    lines = source.splitlines(keepends=True)
    line, column, end_line, end_column = _position(node)
    # ast offsets are in UTF-8 bytes within a line; convert them to characters.
    start = starts[line] + len(lines[line - 1].encode()[:column].decode())
    end = starts[end_line] + len(lines[end_line - 1].encode()[:end_column].decode())
    return source[:start] + text + source[end:]


def _dump_with(top: ast.AST, parent: ast.AST, old: ast.AST, new: ast.AST) -> str:
    """The dump of a top-level statement with one node inside it replaced, in place and undone."""
    for field, value in ast.iter_fields(parent):
        if value is old:
            setattr(parent, field, new)
            try:
                return ast.dump(top)
            finally:
                setattr(parent, field, old)
        if isinstance(value, list) and any(item is old for item in value):
            index = next(i for i, item in enumerate(value) if item is old)
            value[index] = new
            try:
                return ast.dump(top)
            finally:
                value[index] = old
    raise ValueError("the node is not a child of its parent")


def _render(node: ast.AST, original: ast.AST) -> list[str]:
    """Texts for a replacement node: as unparsed, then indented to the original's column."""
    text = ast.unparse(node)
    if isinstance(node, ast.stmt):
        pad = " " * _position(original)[1]
        text = text.replace("\n", "\n" + pad)
        return [text]
    return [text, f"({text})"]


def mutants(source: str, lines: frozenset[int] | None = None) -> Iterator[Mutant]:
    """Every mutant of a module, in source order; only nodes starting on `lines` when given.

    Each mutant parses, and its tree is exactly the original's with the one node replaced, so it is
    a real change (not a reformatting) and nothing else moved. Top-level statements are not
    mutated whole (dropping a module-level `if` would be a change to the import, not a bug).
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    starts = _offsets(source)
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    dumps = [ast.dump(stmt) for stmt in tree.body]
    # Only the top-level statement holding the node may change; text that leaked out of it would
    # change the statement count or the next statement, so those are compared too.
    for index, top in enumerate(tree.body):
        before = dumps[index]
        for node in ast.walk(top):
            if node is top or (lines is not None and getattr(node, "lineno", None) not in lines):
                continue
            if not hasattr(node, "lineno") or _skipped(node, parents):
                continue
            for rule in RULES:
                for operator, description, replacement in rule(node):
                    expected = _dump_with(top, parents[node], node, replacement)
                    if expected == before:
                        continue
                    for text in _render(replacement, node):
                        mutated = _replace(source, starts, node, text)
                        try:
                            reparsed = ast.parse(mutated)
                        except SyntaxError:
                            continue
                        if (
                            len(reparsed.body) == len(dumps)
                            and ast.dump(reparsed.body[index]) == expected
                            and dumps[index + 1 : index + 2]
                            == [ast.dump(s) for s in reparsed.body[index + 1 : index + 2]]
                        ):
                            line, _, end, _ = _position(node)
                            yield Mutant(operator, line, end, description, mutated)
                            break


def common_ends(old: list[str], new: list[str]) -> tuple[int, int]:
    """How many lines the two share at their start, and then at their end (never overlapping)."""
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    return head, tail


def edit_anchor(original: str, mutated: str) -> tuple[str, str]:
    """The smallest whole-line window (`find`, `replace`) turning one text into the other.

    It widens until `find` occurs exactly once in `original` and `replace` (never empty) exactly
    once in `mutated`, so the edit can be applied either way: to break the tree, or to fix it.
    """
    old, new = original.splitlines(keepends=True), mutated.splitlines(keepends=True)
    head, tail = common_ends(old, new)
    if head == len(old) == len(new):
        raise ValueError("the texts are equal: no edit")
    lo, old_hi, new_hi = head, len(old) - tail, len(new) - tail
    while True:
        find, replace = "".join(old[lo:old_hi]), "".join(new[lo:new_hi])
        if find and replace and original.count(find) == 1 and mutated.count(replace) == 1:
            return find, replace
        if lo == 0 and old_hi == len(old):
            return original, mutated
        lo = max(lo - 1, 0)
        old_hi, new_hi = min(old_hi + 1, len(old)), min(new_hi + 1, len(new))
