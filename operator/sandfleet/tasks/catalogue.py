"""The task catalogue: YAML sources and tasks, checked against a pydantic schema; errors at file:line."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,99}$"
SDIST_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*$"
DEFAULT_TEST_COMMAND = "python3 -m pytest -q -p no:cacheprovider"
SCHEMA_VERSION: Literal[1] = 1
# Where a task image lays a catalogue's tasks (sandfleet.rl.catalogue_tasks.prepare_workspace builds it): each
# tree under tasks/<id>, pytest's wheels in .deps, each source's dependencies in .requires/<dir>;
# and the image's own read-only copy of all of it, which scoring runs from (sandbox_image/task_image.py).
WORKSPACE = "/workspace"
PRISTINE_WORKSPACE = "/opt/sandfleet/pristine/workspace"
# How the named-tests rule runs a test command: pytest, through the agent's verdict runner.
PYTEST_COMMANDS = (("python3", "-m", "pytest"), ("python", "-m", "pytest"), ("pytest",))


def suite_pythonpath(deps: str, requires: str | None) -> str:
    """PYTHONPATH for a tree's tests: pytest, the tree, then its dependencies.

    The dependencies come after the tree, so none shadows the package under test (six is both
    isodate's dependency and a task of its own).
    """
    return f"{deps}:." + (f":{requires}" if requires else "")


class CatalogueError(ValueError):
    """The catalogue is not valid; the message says where (file:line), what is wrong and what to do."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Timeouts(_Strict):
    """Seconds each step may take before the task counts as broken (set-up at build, tests per run)."""

    setup_s: Annotated[float, Field(gt=0, le=7200)] = 600.0
    test_s: Annotated[float, Field(gt=0, le=3600)] = 120.0


class Source(_Strict):
    """Where a task's tree comes from and how its tests run: a pinned sdist, or a directory."""

    sdist: Annotated[str | None, Field(pattern=SDIST_PATTERN, description="NAME==VERSION on PyPI")] = None
    dir: Annotated[str | None, Field(description="a directory, relative to the catalogue file")] = None
    setup: Annotated[str | None, Field(description="shell command run once in the tree at build")] = None
    test_command: Annotated[str, Field(min_length=1, description="run in the tree; writes JUnit")] = (
        DEFAULT_TEST_COMMAND
    )
    timeouts: Timeouts = Timeouts()
    tests_passing: Annotated[
        list[str], Field(description="the clean tree's passing tests, as JUnit `classname::name`")
    ] = []

    @model_validator(mode="after")
    def _one_origin(self) -> Source:
        if (self.sdist is None) == (self.dir is None):
            raise ValueError("give exactly one of `sdist` (NAME==VERSION) or `dir`")
        return self

    @property
    def pytest_args(self) -> list[str]:
        """The test command's arguments to pytest (ValueError if the command does not run pytest)."""
        words = shlex.split(self.test_command)
        for command in PYTEST_COMMANDS:
            if tuple(words[: len(command)]) == command:
                return words[len(command) :]
        raise ValueError(
            f"test_command {self.test_command!r} must run pytest (`python3 -m pytest ARGS`): the reward "
            "comes from its named tests' results (docs/tasks.md, How rewards are computed)"
        )

    @property
    def directory(self) -> str | None:
        """The sdist's top directory (NAME-VERSION, as setuptools and hatch name it)."""
        if self.sdist is None:
            return None
        name, version = self.sdist.split("==")
        return f"{name}-{version}"


class Edit(_Strict):
    """Replace the one occurrence of `find` in `file` by `replace`."""

    file: Annotated[str, Field(min_length=1)]
    find: Annotated[str, Field(min_length=1)]
    replace: str

    def apply(self, text: str) -> str:
        """The file's text after the edit; ValueError unless `find` occurs exactly once."""
        count = text.count(self.find)
        if count != 1:
            raise ValueError(f"{self.file}: the edit's `find` text occurs {count} times, not once")
        return text.replace(self.find, self.replace)

    def reverse(self) -> Edit:
        return Edit(file=self.file, find=self.replace, replace=self.find)


class Mutation(_Strict):
    """Which AST operator made the bug, and where (kept so a task says how it was made)."""

    operator: Annotated[str, Field(min_length=1)]
    line: Annotated[int, Field(ge=1)]
    description: str = ""


class Fix(_Strict):
    """The fix: an edit or a patch; when a task gives none, the fix undoes the bug's edit."""

    edit: Edit | None = None
    patch: Annotated[str | None, Field(min_length=1)] = None

    @model_validator(mode="after")
    def _one_change(self) -> Fix:
        if (self.edit is None) == (self.patch is None):
            raise ValueError("give exactly one of `edit` (file, find, replace) or `patch` (a unified diff)")
        return self


class Bug(Fix):
    """The bug: an edit (mined bugs carry their mutation) or a unified diff applied with `patch -p1`."""

    mutation: Mutation | None = None


class Task(_Strict):
    """One bug in one source tree, the tests that catch it, and how it is fixed."""

    id: Annotated[str, Field(pattern=ID_PATTERN)]
    source: Annotated[str, Field(pattern=ID_PATTERN, description="a key of `sources`")]
    bug: Bug
    fix: Fix | None = None
    fail_to_pass: Annotated[list[str], Field(min_length=1, description="tests that fail with the bug")]
    hidden_tests: Annotated[
        dict[str, str], Field(description="files (path: content) written only when tests run")
    ] = {}
    candidates: Annotated[
        list[str], Field(description="replacements an RL policy may try for the bug's edit")
    ] = []
    timeouts: Timeouts | None = None
    # The catalogue's sources[source]: a Catalogue binds each of its tasks, so a task read from one
    # gives all that running it takes (its tree, choices, deciding tests, scoring). Private, so it
    # stays out of the schema and the YAML.
    _source: Source | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _fixable(self) -> Task:
        if self.fix is None and self.bug.edit is None:
            raise ValueError("a bug given as a `patch` needs a `fix`")
        return self

    def fix_edit(self) -> Edit | None:
        """The fix as an edit: the given one, or the bug's edit undone (None for a patch fix)."""
        if self.fix is not None:
            return self.fix.edit
        assert self.bug.edit is not None
        return self.bug.edit.reverse()

    @property
    def source_entry(self) -> Source:
        """The catalogue's `sources` entry this task names; RuntimeError outside a catalogue."""
        if self._source is None:
            raise RuntimeError(
                f"task {self.id} is not bound to its source: use the tasks of a Catalogue "
                "(parse_catalogue, or Catalogue(sources=..., tasks=...)), which binds each one"
            )
        return self._source

    @property
    def bug_edit(self) -> Edit:
        """The bug as an edit; ValueError for a bug given as a patch."""
        if self.bug.edit is None:
            raise ValueError(f"task {self.id}: its bug is a patch, not an edit")
        return self.bug.edit

    @property
    def original(self) -> str:
        """The text as upstream wrote it, which the bug's edit replaces."""
        return self.bug_edit.find

    @property
    def broken(self) -> str:
        """The text the bug's edit leaves in the file."""
        return self.bug_edit.replace

    @property
    def tree(self) -> str:
        """Where the task image lays the task's tree, its bug applied."""
        return f"{WORKSPACE}/tasks/{self.id}"

    @property
    def bug_path(self) -> str:
        """The absolute path, in the task image, of the file the bug's edit changes."""
        return f"{self.tree}/{self.bug_edit.file}"

    @property
    def choices(self) -> tuple[str, ...]:
        """The texts an RL policy chooses from for the broken one: `candidates`, else original and broken."""
        return tuple(self.candidates) or (self.original, self.broken)

    @property
    def correct_choice(self) -> int:
        """The index of the original text in `choices`."""
        return self.choices.index(self.original)

    @property
    def test_timeout_s(self) -> float:
        """Seconds one run of the tests may take: the task's timeouts, else its source's."""
        return (self.timeouts or self.source_entry.timeouts).test_s

    @property
    def workspace_test_command(self) -> str:
        """The source's test command as run in `tree`: pytest and the dependencies from /workspace.

        Scoring does not run it (`scoring()` runs the deciding tests from the image's read-only
        copy); it runs a task's whole suite in its own tree, as the end-to-end checks do.
        """
        source = self.source_entry
        requires = f"{WORKSPACE}/.requires/{source.directory}" if source.directory is not None else None
        return f"PYTHONPATH={suite_pythonpath(f'{WORKSPACE}/.deps', requires)} {source.test_command}"

    def pass_to_pass(self) -> list[str]:
        """Tests that pass with and without the bug: the clean tree's, less the task's FAIL_TO_PASS."""
        failing = set(self.fail_to_pass)
        return [t for t in self.source_entry.tests_passing if t not in failing]

    def deciding(self) -> list[str]:
        """The tests that decide the task: FAIL_TO_PASS, then PASS_TO_PASS."""
        return [*self.fail_to_pass, *self.pass_to_pass()]

    def scoring(self) -> dict[str, object]:
        """The `task` object of an evaluate request that scores this task by its deciding tests.

        Its tree is the image's /workspace/tasks/<id>; the agent rebuilds it from the image's
        read-only copy plus the episode's source edits, and runs pytest with pytest and the
        dependencies from that copy too (docs/tasks.md, How rewards are computed).
        """
        source = self.source_entry
        deps = [f"{PRISTINE_WORKSPACE}/.deps", "."]
        if source.directory is not None:
            deps.append(f"{PRISTINE_WORKSPACE}/.requires/{source.directory}")
        return {
            "tree": self.tree,
            "pristine": f"{PRISTINE_WORKSPACE}/tasks/{self.id}",
            "deciding": self.deciding(),
            "pytest_args": source.pytest_args,
            "pythonpath": deps,
            "files": dict(self.hidden_tests),
            "timeout_s": self.test_timeout_s,
        }


class Catalogue(_Strict):
    """A task catalogue: named sources, and tasks over them."""

    version: Literal[1] = SCHEMA_VERSION
    sources: dict[Annotated[str, Field(pattern=ID_PATTERN)], Source]
    tasks: list[Task]

    @model_validator(mode="after")
    def _bind_tasks(self) -> Catalogue:
        seen: set[str] = set()
        for index, task in enumerate(self.tasks):
            if task.source not in self.sources:
                raise ValueError(
                    f"tasks[{index}] ({task.id}): unknown source {task.source!r}; "
                    f"sources are: {', '.join(sorted(self.sources)) or 'none'}"
                )
            if task.id in seen:
                raise ValueError(f"tasks[{index}]: task id {task.id!r} is used twice; ids must be unique")
            seen.add(task.id)
            # pydantic keeps the Task instances it is given: bind a copy, so a task given to two
            # catalogues knows each one's source.
            bound = task.model_copy()
            bound._source = self.sources[task.source]
            self.tasks[index] = bound
        return self

    def select(self, ids: Iterable[str] | None) -> list[Task]:
        """The tasks with these ids (all when None), in catalogue order; KeyError naming unknown ones."""
        if ids is None:
            return list(self.tasks)
        wanted = list(ids)
        unknown = sorted(set(wanted) - {t.id for t in self.tasks})
        if unknown:
            raise KeyError(f"no task {', '.join(unknown)} in the catalogue")
        return [t for t in self.tasks if t.id in set(wanted)]


def json_schema() -> dict[str, Any]:
    """The catalogue's JSON schema (tasks/catalogue.schema.json is this, written out)."""
    schema = Catalogue.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "sandfleet task catalogue"
    return schema


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


class _LineLoader(yaml.SafeLoader):
    """A safe loader that remembers the line each mapping key and list item starts on."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    mapping = loader.construct_mapping(node, deep=True)
    lines = {key.value: key.start_mark.line + 1 for key, _ in node.value if isinstance(key, yaml.ScalarNode)}
    return _Lined(mapping, lines, node.start_mark.line + 1)


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> list[Any]:
    items = loader.construct_sequence(node, deep=True)
    return _LinedList(items, [child.start_mark.line + 1 for child in node.value])


class _Lined(dict[Any, Any]):
    def __init__(self, data: dict[Any, Any], lines: dict[Any, int], line: int) -> None:
        super().__init__(data)
        self.lines, self.line = lines, line


class _LinedList(list[Any]):
    def __init__(self, data: list[Any], lines: list[int]) -> None:
        super().__init__(data)
        self.lines = lines


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def _line_of(data: Any, location: tuple[int | str, ...]) -> int | None:
    """The line of the deepest part of `location` the parsed YAML still has."""
    line = getattr(data, "line", None)
    for part in location:
        if isinstance(data, _Lined) and part in data:
            line = data.lines.get(part, line)
            data = data[part]
        elif isinstance(data, _LinedList) and isinstance(part, int) and part < len(data):
            line = data.lines[part]
            data = data[part]
        else:
            break
    return line


def _plain(data: Any) -> Any:
    if isinstance(data, dict):
        return {key: _plain(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_plain(item) for item in data]
    return data


def parse_catalogue(text: str, name: str = "<catalogue>") -> Catalogue:
    """Parse and validate a catalogue's YAML text; CatalogueError says `name:line: what; what to do`."""
    try:
        data = yaml.load(text, Loader=_LineLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{name}:{mark.line + 1}" if mark is not None else name
        problem = getattr(error, "problem", None) or str(error)
        raise CatalogueError(f"{where}: not valid YAML: {problem}; fix the syntax there") from None
    if not isinstance(data, dict):
        raise CatalogueError(f"{name}:1: a catalogue is a mapping with `sources` and `tasks`; see the schema")
    try:
        return Catalogue.model_validate(_plain(data))
    except ValidationError as error:
        first = error.errors()[0]
        location = tuple(first["loc"])
        line = _line_of(data, location)
        where = f"{name}:{line}" if line is not None else name
        path = ".".join(str(part) for part in location) or "(top)"
        message = re.sub(r"^Value error, ", "", first["msg"])
        more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
        raise CatalogueError(
            f"{where}: {path}: {message}{more}; see tasks/catalogue.schema.json for the fields"
        ) from None


# YAML reads these as line breaks and folds them (PyYAML writes them raw in plain and quoted
# scalars), so a string holding one only survives a round trip double-quoted, where it is escaped.
_FOLDED_BREAKS = ("\r", "\x85", "\u2028", "\u2029")


def _scalar_style(value: str) -> str | None:
    """Double quotes for YAML's other line breaks, a block for plain multi-line text, else PyYAML's."""
    if any(brk in value for brk in _FOLDED_BREAKS):
        return '"'
    if "\n" in value and not value.endswith((" ", "\t")):
        return "|"
    return None


def dump_catalogue(catalogue: Catalogue) -> str:
    """The catalogue as YAML, in field order, with block strings for multi-line text."""

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=_scalar_style(value))

    Dumper.add_representer(str, text)
    data = catalogue.model_dump(mode="json", exclude_defaults=True)
    data = {"version": catalogue.version, **data}
    return yaml.dump(data, Dumper=Dumper, sort_keys=False, allow_unicode=True, width=100)
