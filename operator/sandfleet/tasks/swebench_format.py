"""SWE-bench instances to and from the task catalogue, and their grading with swebench's own functions.

Pure: text and dicts in, text and dicts out. The `swebench` package (5.0.2) is imported inside the
functions that grade, since importing its harness pulls in docker, datasets and modal (seconds).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sandfleet.tasks.catalogue import (
    ID_PATTERN,
    SDIST_PATTERN,
    Bug,
    Catalogue,
    CatalogueError,
    Edit,
    Fix,
    Source,
    Task,
)
from sandfleet.tasks.mutations import common_ends

# swebench's log parser for the instances we write: pytest's `-rA` summary lines, whole ids kept
# (the plain `parse_log_pytest` cuts an id at its first space, and parametrized ids hold spaces).
LOG_PARSER = "parse_log_pytest_v2"
EVAL_TYPE = "pass_and_fail"
# `pypi/NAME`: the instance's tree is that PyPI sdist's, at the instance's version.
PYPI_OWNER = "pypi"
START_TEST_OUTPUT = ">>>>> Start Test Output"
END_TEST_OUTPUT = ">>>>> End Test Output"
REQUIRED = ("instance_id", "repo", "base_commit", "patch", "FAIL_TO_PASS", "PASS_TO_PASS", "version")

# How a task's file is read for an exact gold patch: (task, path in its tree) -> text, or None.
FileReader = Callable[[Task, str], str | None]


class InstanceError(ValueError):
    """One instance could not be imported; the message says what was wrong and what to do."""

    kind = "bad_instance"

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


class MalformedLine(InstanceError):
    kind = "malformed_json"


class DuplicateInstance(InstanceError):
    kind = "duplicate_instance_id"


class BadField(InstanceError):
    kind = "bad_field"


class MissingImage(InstanceError):
    kind = "missing_image"


class UnknownRepository(InstanceError):
    kind = "unknown_repository"


class UnknownTest(InstanceError):
    kind = "unknown_test"


class BadTestName(InstanceError):
    kind = "bad_test_name"


class UnsupportedPatch(InstanceError):
    kind = "unsupported_patch"


class BadVersion(InstanceError):
    kind = "bad_version"


# -- test names ----------------------------------------------------------------------------------


def _split_outside_brackets(text: str) -> list[str]:
    """`text` split at each `::` not inside `[...]` (a parametrized id may hold `::`, as in IPv6)."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        char = text[i]
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(depth - 1, 0)
        elif depth == 0 and text.startswith("::", i):
            parts.append(text[start:i])
            start = i + 2
            i += 1
        i += 1
    parts.append(text[start:])
    return parts


def junit_to_pytest(name: str) -> str:
    """A catalogue name (JUnit `classname::name`) as pytest's node id, which swebench's parser reads.

    The class part starts at the first dotted part with a capital letter: modules are lower case
    and test classes CamelCase in every catalogued package (a lower-case class would be read as a
    module). `tests.test_idna.IDNATests::test_encode` is `tests/test_idna.py::IDNATests::test_encode`.
    """
    classname, sep, test = name.partition("::")
    if not sep or not classname or not test:
        raise ValueError(f"{name!r} is not a JUnit `classname::name`")
    parts = classname.split(".")
    first_class = next((i for i, part in enumerate(parts) if part[:1].isupper()), len(parts))
    if first_class == 0:
        raise ValueError(f"{name!r} names no module before its class")
    path = "/".join(parts[:first_class]) + ".py"
    return "::".join([path, *parts[first_class:], test])


def pytest_to_junit(node_id: str) -> str:
    """A pytest node id (`path/to/test_x.py::Class::name`) as the catalogue's JUnit name."""
    path, *rest = _split_outside_brackets(node_id)
    if not path.endswith(".py") or not rest or not all(rest):
        raise ValueError(f"{node_id!r} is not a pytest node id (`path/to/test_file.py::[Class::]name`)")
    module = path[: -len(".py")].strip("/").replace("/", ".")
    return "::".join([".".join([module, *rest[:-1]]), rest[-1]])


# -- diffs ---------------------------------------------------------------------------------------


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _hunk_lines(lines: Iterable[str], mark: str) -> str:
    out = []
    for line in lines:
        out.append(mark + line)
        if not line.endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)


def edit_diff(edit: Edit, text: str | None = None, line_hint: int | None = None) -> str:
    """A unified diff (`a/`, `b/`, for `patch -p1` and `git apply`) making `edit` on its file.

    With the file's text it is difflib's, exact, with three lines of context. Without it, the hunk
    holds only the edit's own lines (lines both sides share as context) at `line_hint`: GNU patch,
    the harness's last resort, finds it at any offset; `git apply` needs `--unidiff-zero` when no
    line is shared.
    """
    header = f"diff --git a/{edit.file} b/{edit.file}\n--- a/{edit.file}\n+++ b/{edit.file}\n"
    if text is not None:
        after = edit.apply(text)
        diff = difflib.unified_diff(
            _lines(text), _lines(after), f"a/{edit.file}", f"b/{edit.file}", lineterm="\n"
        )
        body = "".join(
            line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in diff
        )
        return f"diff --git a/{edit.file} b/{edit.file}\n{body}"
    old, new = _lines(edit.find), _lines(edit.replace)
    head, tail = common_ends(old, new)
    start = line_hint or 1
    body = (
        _hunk_lines(old[:head], " ")
        + _hunk_lines(old[head : len(old) - tail], "-")
        + _hunk_lines(new[head : len(new) - tail], "+")
        + _hunk_lines(old[len(old) - tail :], " ")
    )
    return f"{header}@@ -{start},{len(old)} +{start},{len(new)} @@\n{body}"


def new_files_diff(files: Mapping[str, str]) -> str:
    """A unified diff that creates these files (path: content): a test patch of new tests."""
    out = []
    for path in sorted(files):
        lines = _lines(files[path])
        out.append(f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n")
        if lines:
            out.append(f"@@ -0,0 +1,{len(lines)} @@\n{_hunk_lines(lines, '+')}")
    return "".join(out)


_HUNK = re.compile(r"^@@ -(\d+(?:,\d+)?) \+(\d+(?:,\d+)?) @@(.*)$")


def reverse_diff(diff: str) -> str:
    """The unified diff that undoes `diff` (old and new sides swapped, file headers too)."""
    out: list[str] = []
    changed: list[str] = []  # a run of swapped lines, its removals written before its additions

    def flush() -> None:
        out.extend(sorted(changed, key=lambda line: not line.startswith("-")))
        changed.clear()

    lines = diff.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            flush()
            out += ["--- " + lines[i + 1][4:], "+++ " + line[4:]]
            i += 2
            continue
        hunk = _HUNK.match(line.rstrip("\n"))
        if hunk:
            flush()
            out.append(f"@@ -{hunk[2]} +{hunk[1]} @@{hunk[3]}\n")
        elif line.startswith("new file mode"):
            out.append("deleted" + line[len("new") :])
        elif line.startswith("deleted file mode"):
            out.append("new" + line[len("deleted") :])
        elif line.startswith("+"):
            changed.append("-" + line[1:])
            i += 1
            continue
        elif line.startswith("-"):
            changed.append("+" + line[1:])
            i += 1
            continue
        else:
            flush()
            out.append(line)
        i += 1
    flush()
    return "".join(out)


def new_files_of(diff: str) -> dict[str, str]:
    """The files a diff creates (path: content); ValueError if it changes or deletes any file."""
    files: dict[str, str] = {}
    current: str | None = None
    lines = diff.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("--- "):
            if line.rstrip("\n") != "--- /dev/null":
                changed = line[4:].strip()
                changed = changed[2:] if changed.startswith("a/") else changed
                raise ValueError(f"it changes {changed}, which exists: only new test files are kept")
            target = lines[i + 1][4:].strip() if i + 1 < len(lines) else ""
            current = target[2:] if target.startswith("b/") else target
            files[current] = ""
        elif current is not None and line.startswith("+") and not line.startswith("+++"):
            files[current] += line[1:]
        elif current is not None and line.startswith("\\ No newline") and files[current].endswith("\n"):
            files[current] = files[current][:-1]
    return files


# -- export --------------------------------------------------------------------------------------


def stand_in_commit(source: Source) -> str:
    """A base commit standing for the source's tree (an sdist has no git history): a hash of its pin."""
    origin = source.sdist or f"dir:{source.dir}"
    return hashlib.sha1(f"sandfleet source {origin}".encode()).hexdigest()


def _repo_version(source_key: str, source: Source) -> tuple[str, str, str]:
    """The instance's repository (`pypi/NAME` for an sdist, `local/KEY` for a directory), name, version."""
    if source.sdist is not None:
        name, version = source.sdist.split("==")
        return f"{PYPI_OWNER}/{name}", name, version
    return f"local/{source_key}", source_key, "0"


def gold_patch(task: Task, read_file: FileReader | None = None) -> str:
    """The diff that undoes the task's bug: its fix (a patch, an edit, or the bug's edit reversed)."""
    if task.fix is not None and task.fix.patch is not None:
        return task.fix.patch
    edit = task.fix_edit()
    assert edit is not None  # a Task with no fix has an edit bug (Task._fixable)
    text = None
    if read_file is not None and task.bug.edit is not None:
        upstream = read_file(task, task.bug.edit.file)
        # the tree as the image has it: the bug applied (and the fix is made on that file)
        text = (
            task.bug.edit.apply(upstream)
            if upstream is not None and edit.file == task.bug.edit.file
            else None
        )
    hint = task.bug.mutation.line if task.bug.mutation is not None else None
    return edit_diff(edit, text, hint)


def eval_script(task: Task, test_patch: str) -> str:
    """The harness's eval script: apply the test patch in the task's tree, run pytest with `-rA`."""
    lines = [f"cd {task.tree}"]
    if test_patch:
        lines += [
            "git apply -v - <<'EOF_SANDFLEET_TEST_PATCH'",
            test_patch.rstrip("\n"),
            "EOF_SANDFLEET_TEST_PATCH",
        ]
    lines += [f": '{START_TEST_OUTPUT}'", f"{task.workspace_test_command} -rA", f": '{END_TEST_OUTPUT}'"]
    return "\n".join(["#!/bin/bash", "set -uxo pipefail", *lines]) + "\n"


def problem_statement(task: Task, name: str, version: str) -> str:
    """What the policy is told: which tests fail, not where the bug is."""
    failing = [junit_to_pytest(t) for t in task.fail_to_pass]
    shown = ", ".join(failing[:5]) + (f" and {len(failing) - 5} more" if len(failing) > 5 else "")
    return (
        f"{name} {version}: {len(failing)} test(s) fail: {shown}. Find the bug in the package's own "
        "code (not its tests) and fix it, so that these pass and the others still do."
    )


def export_instance(
    task: Task, image: str, created_at: str, read_file: FileReader | None = None
) -> dict[str, Any]:
    """One catalogue task as a SWE-bench instance (its fields as in SWE-bench's datasets)."""
    source = task.source_entry
    repo, name, version = _repo_version(task.source, source)
    commit = stand_in_commit(source)
    test_patch = new_files_diff(task.hidden_tests)
    return {
        "repo": repo,
        "instance_id": task.id,
        "base_commit": commit,
        "patch": gold_patch(task, read_file),
        "test_patch": test_patch,
        "problem_statement": problem_statement(task, name, version),
        "hints_text": "",
        "created_at": created_at,
        "version": version,
        # JSON strings, as in SWE-bench's published datasets (swebench's make_test_spec takes both)
        "FAIL_TO_PASS": json.dumps([junit_to_pytest(t) for t in task.fail_to_pass]),
        "PASS_TO_PASS": json.dumps([junit_to_pytest(t) for t in task.pass_to_pass()]),
        "environment_setup_commit": commit,
        "image": image,
        "log_parser": LOG_PARSER,
        "eval_type": EVAL_TYPE,
        "eval_script": eval_script(task, test_patch),
    }


def export_catalogue(
    catalogue: Catalogue, image: str, created_at: str, read_file: FileReader | None = None
) -> list[dict[str, Any]]:
    """Every task of the catalogue as a SWE-bench instance, in catalogue order."""
    return [export_instance(task, image, created_at, read_file) for task in catalogue.tasks]


def dump_instances(instances: list[dict[str, Any]], json_list: bool) -> str:
    """JSONL (one instance a line), or a JSON list: the two local files swebench's loader reads."""
    if json_list:
        return json.dumps(instances, indent=1) + "\n"
    return "".join(json.dumps(instance) + "\n" for instance in instances)


# -- import --------------------------------------------------------------------------------------


def _test_list(instance: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = instance[key]
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise BadField(where, f"{key} is not a JSON list of test names; give a list") from None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise BadField(where, f"{key} must be a list of test names (or that list as a JSON string)")
    return value


def known_parser(instance: Mapping[str, Any], where: str | None = None) -> str:
    """Which of swebench's log parsers grades the instance; UnknownRepository if swebench has none.

    swebench 5.0.2 names it per instance (`log_parser`, a key of its PARSER_REGISTRY); older
    instances have none, and their repository's parser comes from its MAP_REPO_TO_PARSER_* maps.
    """
    where = where or f"instance {instance.get('instance_id')!r}"
    named = instance.get("log_parser")
    registry, by_repo = _swebench_parsers()
    if named:
        if not isinstance(named, str) or named not in registry:
            raise UnknownRepository(
                where, f"log_parser {named!r} is not one of swebench's parsers; name one of PARSER_REGISTRY's"
            )
        return named
    parser = by_repo.get(str(instance.get("repo")))
    if parser is None:
        raise UnknownRepository(
            where,
            f"swebench's grader does not know the repository {instance.get('repo')!r} and the instance "
            "names no log_parser; add a `log_parser` (a key of swebench's PARSER_REGISTRY)",
        )
    return parser


class SwebenchMissing(RuntimeError):
    """The `swebench` package (or what its harness imports) is not installed here."""


def _swebench_parsers() -> tuple[dict[str, Any], dict[str, str]]:
    """The swebench package's parsers by name, and each repository's parser's name (its repo maps)."""
    try:
        from swebench.harness import log_parsers
        from swebench.harness.log_parsers import c, go, java, javascript, php, python, ruby, rust
    except ImportError as error:
        raise SwebenchMissing(
            f"the swebench package cannot be imported ({error}); hack/bootstrap installs swebench==5.0.2 "
            "with --no-deps and what its harness imports (pyproject.toml's integrations extra)"
        ) from None

    registry: dict[str, Any] = dict(log_parsers.PARSER_REGISTRY)
    # swebench aliases one function under many names (parse_log_flask is parse_log_pytest): name each
    # by its own function name where that is registered too.
    names = {
        id(function): function.__name__ if function.__name__ in registry else name
        for name, function in registry.items()
    }
    by_repo: dict[str, str] = {}
    for module in (c, go, java, javascript, php, python, ruby, rust):
        for attribute, value in vars(module).items():
            if attribute.startswith("MAP_REPO_TO_PARSER"):
                for repo, function in value.items():
                    if id(function) in names:
                        by_repo[repo] = names[id(function)]
    return registry, by_repo


@dataclass
class ImportResult:
    """What an import made: the catalogue of the instances taken, and each skipped one's error."""

    catalogue: Catalogue | None
    imported: list[str] = field(default_factory=list)
    skipped: list[InstanceError] = field(default_factory=list)

    def summary(self) -> str:
        """One line of totals, then one per skipped instance with its reason's kind."""
        counts: dict[str, int] = {}
        for error in self.skipped:
            counts[error.kind] = counts.get(error.kind, 0) + 1
        why = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
        lines = [f"imported {len(self.imported)}, skipped {len(self.skipped)}" + (f" ({why})" if why else "")]
        lines += [f"  skipped [{error.kind}] {error}" for error in self.skipped]
        return "\n".join(lines)


def read_instances(text: str, name: str = "<instances>") -> tuple[list[tuple[str, Any]], list[InstanceError]]:
    """The file's instances, each with where it is (`FILE:LINE` or `FILE[INDEX]`), and bad lines.

    A JSON list (text starting with `[`) is read whole; anything else is JSONL, one instance a line.
    """
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as error:
            return [], [MalformedLine(f"{name}:{error.lineno}", f"not valid JSON: {error.msg}; fix the file")]
        return [(f"{name}[{index}]", item) for index, item in enumerate(items)], []
    found: list[tuple[str, Any]] = []
    errors: list[InstanceError] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            found.append((f"{name}:{number}", json.loads(line)))
        except json.JSONDecodeError as error:
            errors.append(
                MalformedLine(f"{name}:{number}", f"not valid JSON ({error.msg}); one JSON object a line")
            )
    return found, errors


def _source_of(instance: Mapping[str, Any], where: str) -> tuple[str, Source]:
    repo, version = str(instance["repo"]), str(instance["version"])
    if "/" not in repo:
        raise BadField(where, f"repo {repo!r} is not OWNER/NAME")
    sdist = f"{repo.rsplit('/', 1)[1]}=={version}"
    if not re.match(SDIST_PATTERN, sdist):
        raise BadVersion(
            where,
            f"{sdist!r} is not a PyPI pin: the catalogue builds a task from an sdist, so `version` "
            "must be the package's exact PyPI version",
        )
    return sdist, Source(sdist=sdist)


def _instance_task(
    where: str, instance: Any, known_tests: Mapping[str, set[str]]
) -> tuple[Task, Source, list[str]]:
    """One instance as a task over its source (whose passing tests it returns); InstanceError if not."""
    if not isinstance(instance, dict):
        raise MalformedLine(where, "an instance is a JSON object; this is not one")
    label = f"{where} ({instance.get('instance_id', '?')})"
    missing = [key for key in REQUIRED if key not in instance]
    if missing:
        raise BadField(
            label, f"no {', '.join(missing)}; SWE-bench instances carry all of {', '.join(REQUIRED)}"
        )
    if not instance.get("image"):
        raise MissingImage(
            label, "no `image`: name the image the instance's tests run in (a registry reference)"
        )
    known_parser(instance, label)
    task_id = str(instance["instance_id"]).lower()
    if not re.match(ID_PATTERN, task_id):
        raise BadField(label, f"instance_id {task_id!r} does not fit the catalogue's ids ({ID_PATTERN})")
    sdist, source = _source_of(instance, label)
    if not re.match(ID_PATTERN, sdist.replace("==", "-").lower()):
        raise BadVersion(label, f"{sdist!r} does not make a catalogue source id ({ID_PATTERN})")
    names: dict[str, list[str]] = {}
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        try:
            names[key] = [pytest_to_junit(t) for t in _test_list(instance, key, label)]
        except ValueError as error:
            if isinstance(error, InstanceError):
                raise
            raise BadTestName(label, f"{key}: {error}; sandfleet scores pytest tests by node id") from None
    fail, passing = names["FAIL_TO_PASS"], names["PASS_TO_PASS"]
    if not fail:
        raise UnknownTest(label, "FAIL_TO_PASS is empty, so nothing decides the task; name the failing tests")
    both = sorted(set(fail) & set(passing))
    if both:
        raise UnknownTest(label, f"{junit_to_pytest(both[0])} is in both FAIL_TO_PASS and PASS_TO_PASS")
    known = known_tests.get(sdist)
    if known is not None:
        unknown = [t for t in fail if t not in known]
        if unknown:
            raise UnknownTest(
                label,
                f"FAIL_TO_PASS names {junit_to_pytest(unknown[0])}, which {sdist}'s tests do not have"
                + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
                + "; correct the name or drop the instance",
            )
    patch = str(instance["patch"])
    if "@@" not in patch:
        raise UnsupportedPatch(label, "the gold `patch` holds no hunk; give the diff that fixes the bug")
    try:
        hidden = new_files_of(str(instance.get("test_patch") or ""))
    except ValueError as error:
        raise UnsupportedPatch(label, f"test_patch: {error}; the catalogue writes whole test files") from None
    key = sdist.replace("==", "-").lower()  # the catalogue's own key for a sdist (idna-3.7)
    try:
        task = Task(
            id=task_id,
            source=key,
            bug=Bug(patch=reverse_diff(patch)),
            fix=Fix(patch=patch),
            fail_to_pass=fail,
            hidden_tests=hidden,
        )
    except ValueError as error:  # pydantic's ValidationError: say which field, not a traceback
        raise BadField(label, f"not a valid task: {str(error).splitlines()[-2].strip()}") from None
    return task, source, sorted({*fail, *passing})


def import_instances(
    text: str, name: str = "<instances>", known_tests: Mapping[str, set[str]] | None = None
) -> ImportResult:
    """SWE-bench instances (JSONL or a JSON list) as a catalogue; each bad one skipped with its error.

    A task's source is the sdist `NAME==version` (NAME the repository's last part: an instance's
    tree must be a PyPI sdist's); its passing tests are the union of its instances' FAIL_TO_PASS
    and PASS_TO_PASS. `known_tests` (sdist: its tests) lets FAIL_TO_PASS be checked against them.
    """
    found, skipped = read_instances(text, name)
    seen: dict[str, str] = {}
    tasks: list[Task] = []
    sources: dict[str, Source] = {}
    passing: dict[str, set[str]] = {}
    for where, instance in found:
        instance_id = instance.get("instance_id") if isinstance(instance, dict) else None
        if isinstance(instance_id, str) and instance_id.lower() in seen:
            skipped.append(
                DuplicateInstance(
                    f"{where} ({instance_id})",
                    f"instance_id already given at {seen[instance_id.lower()]}; ids must be unique",
                )
            )
            continue
        try:
            task, source, tests = _instance_task(where, instance, known_tests or {})
        except InstanceError as error:
            skipped.append(error)
            continue
        seen[task.id] = where
        tasks.append(task)
        sources.setdefault(task.source, source)
        passing.setdefault(task.source, set()).update(tests)
    if not tasks:
        return ImportResult(None, [], skipped)
    try:
        catalogue = Catalogue(
            sources={
                key: source.model_copy(update={"tests_passing": sorted(passing[key])})
                for key, source in sources.items()
            },
            tasks=tasks,
        )
    except (ValueError, CatalogueError) as error:  # pydantic's ValidationError is a ValueError
        return ImportResult(
            None, [], [*skipped, InstanceError(name, f"the catalogue did not validate: {error}")]
        )
    return ImportResult(catalogue, [t.id for t in tasks], skipped)


# -- grading -------------------------------------------------------------------------------------


def grade(instance: Mapping[str, Any], log: str) -> dict[str, Any]:
    """The swebench package's report for one instance from its raw test log (pytest `-rA` output).

    The log is what swebench's harness runs: pytest with `-rA`. The instance's parser reads it
    (only what lies between the harness's start and end markers,
    when the log has them), then swebench's `get_eval_tests_report` and `get_resolution_status`
    decide: a FAIL_TO_PASS or PASS_TO_PASS test the log does not show passing is a failure.
    """
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, EvalType, ResolvedStatus
    from swebench.harness.grading import get_eval_tests_report, get_resolution_status
    from swebench.types import TestSpec

    where = f"instance {instance.get('instance_id')!r}"
    parser_name = known_parser(instance)
    registry, _ = _swebench_parsers()
    f2p = _test_list(instance, FAIL_TO_PASS, where)
    p2p = _test_list(instance, PASS_TO_PASS, where)
    eval_type = EvalType(instance.get("eval_type") or EVAL_TYPE)
    spec = TestSpec(
        instance_id=str(instance.get("instance_id")),
        image=str(instance.get("image", "")),
        eval_script_list=[],
        repo=str(instance.get("repo")),
        version=str(instance.get("version")),
        FAIL_TO_PASS=f2p,
        PASS_TO_PASS=p2p,
        log_parser=parser_name,
        eval_type=eval_type.value,
    )
    if START_TEST_OUTPUT in log and END_TEST_OUTPUT in log:
        log = log.split(START_TEST_OUTPUT)[1].split(END_TEST_OUTPUT)[0]
    status_map = registry[parser_name](log, spec)
    report = get_eval_tests_report(status_map, {FAIL_TO_PASS: f2p, PASS_TO_PASS: p2p}, eval_type=eval_type)
    resolution = get_resolution_status(report)
    return {
        "instance_id": spec.instance_id,
        "resolved": resolution == ResolvedStatus.FULL.value,
        "resolution": resolution,
        "tests_status": report,
    }
