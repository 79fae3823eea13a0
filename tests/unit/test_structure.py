"""One name per concept: no public class defined twice, no module name repeated unlisted, no import cycle.

And no module outside the import contracts (`.importlinter`): each is placed among its neighbours.

The module graph is import-linter's (`grimp`), over `sandfleet` and `sandfleet_agent`; it holds every
import statement, those inside function bodies included (checked here, since the cycle test relies
on it). The module names allowed to repeat are the table in docs/architecture.md, "Module names
that repeat".
"""

from __future__ import annotations

import ast
import configparser
import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grimp
import pytest

import sandfleet

REPO = Path(__file__).resolve().parents[2]
PACKAGE_ROOT = Path(sandfleet.__file__).resolve().parent
SANDBOX_IMAGE = REPO / "sandbox_image"
ARCHITECTURE = REPO / "docs" / "architecture.md"
IMPORTLINTER = REPO / ".importlinter"
CONTRACT_PREFIX = "importlinter:contract:"
REPEATS_HEADING = "## Module names that repeat"


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("sandfleet", "sandfleet_agent")


def public_classes(tree: ast.Module) -> Iterator[str]:
    """Classes a module defines at its top level (under an `if` or `try` too), `_private` ones aside."""
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.ClassDef):
            if not node.name.startswith("_"):
                yield node.name
        elif isinstance(node, ast.If | ast.Try | ast.With):
            pending.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))


def test_no_public_class_name_is_defined_twice() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        for name in public_classes(ast.parse(path.read_text(), str(path))):
            where[name].append(str(path.relative_to(REPO)))
    twice = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not twice, f"one name per concept: rename all but one of each {twice}"


def allowed_repeats() -> dict[str, set[str]]:
    """The table under "Module names that repeat": each name and the modules that share it."""
    text = ARCHITECTURE.read_text()
    assert REPEATS_HEADING in text, f"{ARCHITECTURE} lost its section {REPEATS_HEADING!r}"
    section = text.split(REPEATS_HEADING, 1)[1].split("\n## ", 1)[0]
    allowed: dict[str, set[str]] = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue  # prose, the header row and its rule
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 3, f"a row of name, modules and reason: {line!r}"
        name, modules, reason = cells
        assert reason, f"{name}: say why the modules share the name"
        allowed[name.strip("`")] = set(re.findall(r"`([\w.]+)`", modules))
    assert allowed, f"no rows read under {REPEATS_HEADING!r}"
    return allowed


def names_in_use(modules: Iterable[str]) -> dict[str, set[str]]:
    """Each module name (its last part, packages included) and the modules that bear it."""
    bearers: dict[str, set[str]] = defaultdict(set)
    for module in modules:
        name = module.rsplit(".", 1)[-1]
        if not (name.startswith("__") and name.endswith("__")):  # Python's names, not ours
            bearers[name].add(module)
    return bearers


def test_a_module_name_repeats_only_where_the_architecture_says_why(graph: grimp.ImportGraph) -> None:
    repeated = {name: mods for name, mods in names_in_use(graph.modules).items() if len(mods) > 1}
    allowed = allowed_repeats()
    unlisted = {name: sorted(mods) for name, mods in repeated.items() if mods != allowed.get(name)}
    assert not unlisted, (
        f"these module names repeat: rename one, or if it is the same role in parallel packages, "
        f"list exactly its modules with the reason in docs/architecture.md ({REPEATS_HEADING[3:]}): "
        f"{unlisted}"
    )
    stale = {name: sorted(mods) for name, mods in allowed.items() if name not in repeated}
    assert not stale, f"docs/architecture.md lists repeats that no longer exist: {stale}"


def test_the_table_reader_sees_an_unlisted_repeat_and_a_stale_row() -> None:
    # The check above is only as good as the table it reads: a row read wrong would pass anything.
    assert allowed_repeats()["metrics"] == {
        "sandfleet.controller.metrics",
        "sandfleet.gateway.metrics",
        "sandfleet.kube.metrics",
    }
    in_use = names_in_use(
        ["sandfleet.a.metrics", "sandfleet.b.metrics", "sandfleet.a", "sandfleet.a.__init__"]
    )
    assert in_use == {"metrics": {"sandfleet.a.metrics", "sandfleet.b.metrics"}, "a": {"sandfleet.a"}}


def function_imports(path: Path, module: str, modules: set[str]) -> Iterator[tuple[str, int]]:
    """The modules of the graph that `module` imports inside its function bodies, with the line."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    functions = [
        node
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    for function in functions:
        for node in ast.walk(function):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules:
                        yield alias.name, node.lineno
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{parent}.{base}" if base else parent
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    target = submodule if submodule in modules else base
                    if target in modules:
                        yield target, node.lineno


def test_the_graph_holds_the_imports_inside_function_bodies(graph: grimp.ImportGraph) -> None:
    modules = set(graph.modules)
    seen = 0
    for root in (PACKAGE_ROOT, SANDBOX_IMAGE / "sandfleet_agent"):
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root.parent).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            for imported, line in function_imports(path, module, modules):
                if imported == module:
                    continue
                seen += 1
                assert graph.direct_import_exists(importer=module, imported=imported), (
                    f"{module}:{line} imports {imported} in a function, and the graph misses it"
                )
    assert seen > 20, "the scan found almost no imports inside functions: it is reading nothing"


def cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import cycles: each strongly connected group of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in edges:
                    continue
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(edges[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    group: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
    return found


def test_cycles_finds_a_loop_and_passes_a_chain() -> None:
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert cycles({"a": ["b"], "b": ["c"], "c": [], "d": ["a", "c"]}) == []


def test_no_import_cycle_between_modules(graph: grimp.ImportGraph) -> None:
    edges = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    found = cycles(edges)
    assert not found, (
        "modules that import each other (at the top or inside functions): move what they share into "
        f"a module both can import: {found}"
    )


def test_no_import_cycle_between_the_image_builders() -> None:
    # sandbox_image/'s builders are loose modules on sys.path (sandbox_image/build runs them with the
    # host's python3), outside the graph above.
    builders = {path.stem: path for path in SANDBOX_IMAGE.glob("*.py")}
    assert {"image_builder", "task_image", "build_cli"} <= builders.keys()
    edges: dict[str, set[str]] = {}
    for name, path in builders.items():
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
        edges[name] = imported & builders.keys()
    assert "image_builder" in edges["task_image"], (
        "the check reads no imports: task_image builds on image_builder"
    )
    assert not cycles(edges), f"the image builders import each other: {edges}"


def read_contracts(text: str) -> dict[str, configparser.SectionProxy]:
    """The contracts of an `.importlinter` file, by id (the part after `importlinter:contract:`)."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(text)
    return {
        section.removeprefix(CONTRACT_PREFIX): parser[section]
        for section in parser.sections()
        if section.startswith(CONTRACT_PREFIX)
    }


def entries(contract: configparser.SectionProxy, option: str) -> list[str]:
    """An option's lines (a list in import-linter's INI format), blank ones aside."""
    return [line.strip() for line in contract.get(option, "").splitlines() if line.strip()]


def expand(expression: str, modules: Collection[str]) -> set[str]:
    """The modules an import-linter module expression names: `*` is one part of a name, `**` any."""
    if "*" not in expression:
        return {expression}
    parts = {"*": r"[^.]+", "**": r".+"}
    pattern = r"\.".join(parts.get(part, re.escape(part)) for part in expression.split("."))
    return {module for module in modules if re.fullmatch(pattern, module)}


@dataclass
class Coverage:
    """Which contracts name each module: as a layer, or as a source (forbidden or independence)."""

    layers: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    sources: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))


def coverage(contracts: Mapping[str, configparser.SectionProxy], modules: Collection[str]) -> Coverage:
    """The modules each contract names: its layers under each container, or its source modules."""
    named = Coverage()
    for contract_id, contract in contracts.items():
        kind = contract.get("type")
        if kind == "layers":
            containers = [m for e in entries(contract, "containers") for m in expand(e, modules)] or [""]
            for layer in entries(contract, "layers"):
                for tail in re.split(r"[|:]", layer):
                    tail = tail.strip().removeprefix("(").removesuffix(")")  # (optional) layers too
                    for container in containers:
                        named.layers[f"{container}.{tail}" if container else tail].add(contract_id)
        elif kind in ("forbidden", "independence"):
            option = "source_modules" if kind == "forbidden" else "modules"
            for expression in entries(contract, option):
                for module in expand(expression, modules):
                    named.sources[module].add(contract_id)
        else:
            raise AssertionError(f"{contract_id}: teach test_structure what a {kind!r} contract covers")
    return named


def uncovered(named: Coverage, modules: Collection[str]) -> dict[str, str]:
    """Each module no contract covers, with the contract to add it to.

    A module is covered when a contract names it: as a layer, or among a forbidden contract's
    source modules (an independence contract's modules). Where layers order a package's modules,
    every module of that package must be a layer (or be named itself): that a package above it is
    a source does not place it among its neighbours (gateway.recycling stood outside the gateway's
    layers, yet in the package an independence contract names). In a package no layers order, a
    source package above it covers it, since the contract holds for every module in it; but not a
    root package, whose contracts (no Kubernetes client anywhere) say nothing of where a module sits.
    The root packages themselves hold every layer, so they are in none (their `__init__` imports
    nothing: test_the_root_packages_import_nothing).
    """
    roots = {module for module in modules if "." not in module}
    ordering: dict[str, set[str]] = defaultdict(set)
    for layer, contract_ids in named.layers.items():
        ordering[layer.rpartition(".")[0]] |= contract_ids
    holes: dict[str, str] = {}
    for module in sorted(modules):
        if module in roots or module in named.layers or module in named.sources:
            continue
        package = module.rpartition(".")[0]
        if package in ordering:
            holes[module] = (
                f"add it to the layers of {sorted(ordering[package])}, which order {package}'s modules"
            )
            continue
        parts = module.split(".")
        above = {".".join(parts[:end]) for end in range(2, len(parts))}  # its packages, the root aside
        if not above & named.sources.keys():
            either = "the module" if package in roots else f"{package} or the module"
            holes[module] = (
                f"add a layers contract with `containers = {package}` and `exhaustive = True` "
                f"(or name {either} in a forbidden contract's source_modules)"
            )
    return holes


def test_every_module_is_under_a_contract_of_its_package(graph: grimp.ImportGraph) -> None:
    modules = set(graph.modules)
    holes = uncovered(coverage(read_contracts(IMPORTLINTER.read_text()), modules), modules)
    assert not holes, "modules outside every contract of their package (.importlinter):\n" + "\n".join(
        f"  {module}: {fix}" for module, fix in holes.items()
    )


def test_the_root_packages_import_nothing(graph: grimp.ImportGraph) -> None:
    # No layer holds a root package (it holds them all), so what it imported would be unchecked.
    for root in ("sandfleet", "sandfleet_agent"):
        imported = graph.find_modules_directly_imported_by(root)
        assert not imported, f"{root}/__init__.py imports {sorted(imported)}: move that into a module"


def test_the_coverage_reader_finds_a_module_outside_its_package_contracts() -> None:
    # The check above is only as good as its reading of the contracts: a loose one would pass anything.
    contracts = read_contracts(
        """
[importlinter]
root_packages =
    pkg

[importlinter:contract:a-layers]
name = a's modules in layers
type = layers
containers =
    pkg.a
layers =
    top
    x | (y)
    z : w

[importlinter:contract:b-alone]
name = b and one of a's stand alone
type = forbidden
source_modules =
    pkg.b
    pkg.a.named
# a comment between the lines of a list
    pkg.c.*
forbidden_modules =
    os

[importlinter:contract:all]
name = a rule for every module says nothing of where one sits
type = forbidden
source_modules =
    pkg
forbidden_modules =
    os

[importlinter:contract:d-e]
name = d and e are independent
type = independence
modules =
    pkg.d
    pkg.e
"""
    )
    modules = {
        "pkg",
        *("pkg.a", "pkg.a.top", "pkg.a.x", "pkg.a.y", "pkg.a.z", "pkg.a.w", "pkg.a.stray", "pkg.a.named"),
        *("pkg.b", "pkg.b.one", "pkg.b.deep", "pkg.b.deep.two"),
        *("pkg.c", "pkg.c.one", "pkg.c.one.two"),
        *("pkg.d", "pkg.d.one", "pkg.e", "pkg.f", "pkg.f.one"),
    }
    named = coverage(contracts, modules)
    assert named.layers.keys() == {f"pkg.a.{tail}" for tail in ("top", "x", "y", "z", "w")}
    holes = uncovered(named, modules)
    # pkg.a is in no layer of pkg, pkg.a.stray in none of a's; pkg.c only names its modules.
    assert holes.keys() == {"pkg.a", "pkg.a.stray", "pkg.c", "pkg.f", "pkg.f.one"}
    assert "['a-layers']" in holes["pkg.a.stray"]
    assert "containers = pkg.f" in holes["pkg.f.one"]


def test_the_architecture_page_names_every_module() -> None:
    """docs/architecture.md is the map: each module has a row (its file name or path, in backticks)."""
    page = ARCHITECTURE.read_text()
    unnamed = [
        str(path.relative_to(REPO))
        for root, prefix in ((PACKAGE_ROOT, ""), (SANDBOX_IMAGE, "sandbox_image/"))
        for path in sorted(root.rglob("*.py"))
        if path.name != "__init__.py"
        and f"`{path.name}`" not in page
        and f"`{prefix}{path.relative_to(root).as_posix()}`" not in page
    ]
    assert not unnamed, f"name these modules in docs/architecture.md, with what each holds: {unnamed}"
