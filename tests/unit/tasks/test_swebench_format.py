"""SWE-bench format: export, import and grading, checked with the real `swebench` package (5.0.2).

The logs are real: pytest runs a small project with `-rA`, as swebench's harness does, with the
bug, with the gold patch and with a plausible wrong one, and swebench's own parser and report
functions grade them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from swebench.harness.utils import load_swebench_dataset, make_test_spec

from sandfleet.tasks.catalogue import Catalogue, Edit, Task, parse_catalogue
from sandfleet.tasks.swebench_format import (
    BadTestName,
    DuplicateInstance,
    MalformedLine,
    MissingImage,
    UnknownRepository,
    UnknownTest,
    UnsupportedPatch,
    dump_instances,
    edit_diff,
    export_catalogue,
    export_instance,
    grade,
    import_instances,
    junit_to_pytest,
    new_files_diff,
    new_files_of,
    pytest_to_junit,
    reverse_diff,
)

REPO = Path(__file__).resolve().parents[3]
OPS = "def add(a, b):\n    return a + b\n\n\ndef double(x):\n    return add(x, x)\n"
TESTS = """\
import pytest

from calc.ops import add, double


class TestAdd:
    def test_add(self):
        assert add(2, 3) == 5

    def test_same(self):
        assert add(2, 2) == 4


def test_double():
    assert double(0) == 0


@pytest.mark.parametrize("pair", ["a b", "c d"])
def test_spaced(pair):
    assert " " in pair
"""
CATALOGUE = """\
version: 1
sources:
  calc:
    dir: calc-src
    tests_passing:
    - tests.test_ops.TestAdd::test_add
    - tests.test_ops.TestAdd::test_same
    - tests.test_ops::test_double
    - tests.test_ops::test_spaced[a b]
    - tests.test_ops::test_spaced[c d]
tasks:
- id: calc-add-sub-001
  source: calc
  bug:
    edit: {file: calc/ops.py, find: "    return a + b\\n", replace: "    return a - b\\n"}
    mutation: {operator: arith_swap, line: 2}
  fail_to_pass:
  - tests.test_ops.TestAdd::test_add
  - tests.test_ops.TestAdd::test_same
"""
BUG = Edit(file="calc/ops.py", find="    return a + b\n", replace="    return a - b\n")
# Right for equal arguments only: test_same passes, test_add still fails.
WRONG = Edit(file="calc/ops.py", find="    return a - b\n", replace="    return a + b if a == b else a - b\n")


def run_pytest(tree: Path) -> str:
    """The project's tests as swebench's harness runs pytest: `-rA`, the summary naming each test."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    argv = [sys.executable, "-m", "pytest", "-rA", "-q", "-p", "no:cacheprovider", "--rootdir", str(tree)]
    result = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=60, check=False)
    return result.stdout


def apply(tree: Path, patch: str, *command: str) -> None:
    subprocess.run(list(command), cwd=tree, input=patch, text=True, check=True, capture_output=True)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The catalogue, its one task's instance, the bug's tree and the logs of the three trees."""
    root = tmp_path_factory.mktemp("swebench")
    upstream = root / "calc-src"
    (upstream / "calc").mkdir(parents=True)
    (upstream / "tests").mkdir()
    (upstream / "calc" / "__init__.py").write_text("")
    (upstream / "calc" / "ops.py").write_text(OPS)
    (upstream / "tests" / "test_ops.py").write_text(TESTS)
    (root / "calc.yaml").write_text(CATALOGUE)
    catalogue = parse_catalogue(CATALOGUE, "calc.yaml")
    instance = export_instance(
        catalogue.tasks[0],
        "localhost:5000/tasks-calc:latest",
        "2026-12-07T00:00:00+00:00",
        lambda task, path: (upstream / path).read_text(),
    )
    logs = {}
    for name in ("bug", "gold", "wrong"):
        tree = root / name
        shutil.copytree(upstream, tree)
        ops = tree / "calc" / "ops.py"
        ops.write_text(BUG.apply(ops.read_text()))
        if name == "gold":
            apply(tree, instance["patch"], "git", "apply", "-")
        elif name == "wrong":
            ops.write_text(WRONG.apply(ops.read_text()))
        logs[name] = run_pytest(tree)
    return {"root": root, "catalogue": catalogue, "instance": instance, "logs": logs}


def shipped() -> Catalogue:
    return parse_catalogue((REPO / "tasks" / "catalogue.yaml").read_text(), "tasks/catalogue.yaml")


def test_test_names_map_both_ways_for_every_shipped_test() -> None:
    assert (
        junit_to_pytest("tests.test_idna.IDNATests::test_encode")
        == "tests/test_idna.py::IDNATests::test_encode"
    )
    assert junit_to_pytest("test_six::test_move_items[input]") == "test_six.py::test_move_items[input]"
    assert pytest_to_junit("tests/test_urlutils.py::test_roundtrip[https://[::1]:80/]") == (
        "tests.test_urlutils::test_roundtrip[https://[::1]:80/]"
    )
    with pytest.raises(ValueError, match="not a pytest node id"):
        pytest_to_junit("test_foo (tests.TestBar)")
    catalogue = shipped()
    names = {n for s in catalogue.sources.values() for n in s.tests_passing}
    assert len(names) > 500
    for name in names:
        assert pytest_to_junit(junit_to_pytest(name)) == name


def test_an_instance_has_swebench_fields_and_makes_its_test_spec(project: dict[str, object]) -> None:
    instance = project["instance"]
    assert isinstance(instance, dict)
    assert instance["repo"] == "local/calc"
    assert instance["image"] == "localhost:5000/tasks-calc:latest"
    assert json.loads(instance["FAIL_TO_PASS"]) == [
        "tests/test_ops.py::TestAdd::test_add",
        "tests/test_ops.py::TestAdd::test_same",
    ]
    assert "tests/test_ops.py::test_spaced[a b]" in json.loads(instance["PASS_TO_PASS"])
    assert instance["test_patch"] == ""
    assert instance["base_commit"] == instance["environment_setup_commit"]
    assert len(instance["base_commit"]) == 40
    spec = make_test_spec(instance)  # swebench's own: the fields its harness needs are there
    assert json.loads(instance["FAIL_TO_PASS"]) == spec.FAIL_TO_PASS
    assert ">>>>> Start Test Output" in spec.eval_script
    assert "-rA" in spec.eval_script


def test_the_gold_patch_resolves_fully(project: dict[str, object]) -> None:
    logs = project["logs"]
    assert isinstance(logs, dict)
    assert "PASSED tests/test_ops.py::test_spaced[a b]" in logs["gold"]
    report = grade(project["instance"], logs["gold"])  # type: ignore[arg-type]
    assert report["resolution"] == "RESOLVED_FULL"
    assert report["resolved"] is True
    assert report["tests_status"]["PASS_TO_PASS"]["failure"] == []


def test_an_empty_patch_is_unresolved(project: dict[str, object]) -> None:
    report = grade(project["instance"], project["logs"]["bug"])  # type: ignore[arg-type, index]
    assert report["resolution"] == "RESOLVED_NO"
    assert len(report["tests_status"]["FAIL_TO_PASS"]["failure"]) == 2


def test_a_wrong_patch_is_partial(project: dict[str, object]) -> None:
    report = grade(project["instance"], project["logs"]["wrong"])  # type: ignore[arg-type, index]
    assert report["resolution"] == "RESOLVED_PARTIAL"
    assert report["resolved"] is False
    assert report["tests_status"]["FAIL_TO_PASS"] == {
        "success": ["tests/test_ops.py::TestAdd::test_same"],
        "failure": ["tests/test_ops.py::TestAdd::test_add"],
    }


def test_a_fail_to_pass_test_missing_from_the_log_counts_as_failed(project: dict[str, object]) -> None:
    gold = project["logs"]["gold"]  # type: ignore[index]
    cut = "\n".join(line for line in gold.splitlines() if "TestAdd::test_add" not in line)
    report = grade(project["instance"], cut)  # type: ignore[arg-type]
    assert report["resolution"] == "RESOLVED_PARTIAL"
    assert report["tests_status"]["FAIL_TO_PASS"]["failure"] == ["tests/test_ops.py::TestAdd::test_add"]
    # Inside the harness's markers only what lies between them counts.
    outside = "PASSED tests/test_ops.py::TestAdd::test_add\n"
    marked = f"{outside}>>>>> Start Test Output\n{cut}\n>>>>> End Test Output\n"
    assert grade(project["instance"], marked)["resolved"] is False  # type: ignore[arg-type]


def test_the_gold_patch_without_the_file_still_applies(project: dict[str, object]) -> None:
    root = project["root"]
    assert isinstance(root, Path)
    tree = root / "zero-context"
    shutil.copytree(root / "bug", tree)
    catalogue = project["catalogue"]
    assert isinstance(catalogue, Catalogue)
    patch = export_instance(catalogue.tasks[0], "img", "now")["patch"]
    assert "@@ -2,1 +2,1 @@" in patch
    # git finds a hunk without context lines at any offset with --unidiff-zero (GNU patch always)
    apply(tree, patch, "git", "apply", "--unidiff-zero", "-")
    assert (tree / "calc" / "ops.py").read_text() == OPS
    # A mutation's line need not be where the edit starts: the hunk is found 4 lines off too.
    undo = edit_diff(BUG, None, 6)
    assert "@@ -6,1 +6,1 @@" in undo
    apply(tree, undo, "git", "apply", "--unidiff-zero", "-")
    assert (tree / "calc" / "ops.py").read_text() == BUG.apply(OPS)


def test_the_exported_catalogue_reads_back_with_swebench_and_grades_the_same(
    project: dict[str, object], tmp_path: Path
) -> None:
    catalogue = shipped()
    instances = export_catalogue(catalogue, "tasks-catalogue", "2026-12-07T00:00:00+00:00")
    for suffix, json_list in ((".jsonl", False), (".json", True)):
        path = tmp_path / f"catalogue{suffix}"
        path.write_text(dump_instances(instances, json_list=json_list))
        loaded = load_swebench_dataset(str(path))
        assert [dict(i) for i in loaded] == instances
    for task, instance in zip(catalogue.tasks, loaded, strict=True):
        f2p, p2p = json.loads(instance["FAIL_TO_PASS"]), json.loads(instance["PASS_TO_PASS"])
        assert f2p == [junit_to_pytest(t) for t in task.fail_to_pass]
        passing = "".join(f"PASSED {t}\n" for t in [*f2p, *p2p])
        assert grade(instance, passing)["resolution"] == "RESOLVED_FULL"
        failing = "".join(f"FAILED {t} - AssertionError\n" for t in f2p) + "".join(
            f"PASSED {t}\n" for t in p2p
        )
        assert grade(instance, failing)["resolution"] == "RESOLVED_NO"
    # The small project's instance, read back by swebench's loader, grades its real logs alike.
    path = tmp_path / "calc.jsonl"
    path.write_text(dump_instances([project["instance"]], json_list=False))  # type: ignore[list-item]
    (back,) = load_swebench_dataset(str(path))
    logs = project["logs"]
    assert isinstance(logs, dict)
    for log in logs.values():
        assert grade(back, log) == grade(project["instance"], log)  # type: ignore[arg-type]


def test_the_shipped_export_imports_back_to_the_same_tests() -> None:
    catalogue = shipped()
    text = dump_instances(export_catalogue(catalogue, "tasks-catalogue", "now"), json_list=False)
    result = import_instances(text, "catalogue.jsonl")
    assert result.skipped == []
    assert result.catalogue is not None
    for before, after in zip(catalogue.tasks, result.catalogue.tasks, strict=True):
        assert (after.id, after.fail_to_pass, after.pass_to_pass()) == (
            before.id,
            before.fail_to_pass,
            before.pass_to_pass(),
        )
        assert after.source_entry.sdist == before.source_entry.sdist


def test_an_imported_bug_is_the_gold_patch_undone(project: dict[str, object]) -> None:
    root = project["root"]
    assert isinstance(root, Path)
    result = import_instances(json.dumps(project["instance"]) + "\n", "calc.jsonl")
    assert result.catalogue is not None
    (task,) = result.catalogue.tasks
    assert task.fix is not None
    assert task.fix.patch == project["instance"]["patch"]  # type: ignore[index]
    tree = root / "imported"
    shutil.copytree(root / "calc-src", tree)
    assert task.bug.patch is not None
    apply(tree, task.bug.patch, "git", "apply", "-")
    assert (tree / "calc" / "ops.py").read_text() == (root / "bug" / "calc" / "ops.py").read_text()
    assert task.deciding() == [
        "tests.test_ops.TestAdd::test_add",
        "tests.test_ops.TestAdd::test_same",
        "tests.test_ops::test_double",
        "tests.test_ops::test_spaced[a b]",
        "tests.test_ops::test_spaced[c d]",
    ]


def test_hidden_tests_travel_as_a_test_patch_of_new_files() -> None:
    files = {"tests/test_hidden.py": "def test_x():\n    assert True\n", "tests/data.txt": "no newline"}
    diff = new_files_diff(files)
    assert new_files_of(diff) == files
    assert reverse_diff(reverse_diff(diff)) == diff
    with pytest.raises(ValueError, match=r"changes tests/test_ops\.py"):
        new_files_of(edit_diff(Edit(file="tests/test_ops.py", find="a\n", replace="b\n")))


def bad_instances(good: dict[str, object]) -> str:
    def variant(**changes: object) -> dict[str, object]:
        changed = {**good, **changes}
        return {k: v for k, v in changed.items() if v is not None}

    lines = [
        json.dumps(good),
        "{not json",
        json.dumps(good),  # the same id again
        json.dumps(variant(instance_id="no-image", image=None)),
        json.dumps(variant(instance_id="unknown-repo", repo="acme/widget", log_parser=None)),
        json.dumps(variant(instance_id="unknown-parser", log_parser="parse_log_nothing")),
        json.dumps(variant(instance_id="unknown-test", FAIL_TO_PASS='["tests/test_ops.py::test_nope"]')),
        json.dumps(variant(instance_id="django-style", FAIL_TO_PASS='["test_x (tests.Foo)"]')),
        json.dumps(variant(instance_id="changes-tests", test_patch=edit_diff(BUG))),
        json.dumps(variant(instance_id="known-repo", repo="psf/requests", version="2.31.0", log_parser=None)),
    ]
    return "\n".join(lines) + "\n"


def test_bad_instances_are_skipped_each_with_its_typed_error(project: dict[str, object]) -> None:
    good = project["instance"]
    assert isinstance(good, dict)
    known = {"calc==0": {"tests.test_ops.TestAdd::test_add", "tests.test_ops.TestAdd::test_same"}}
    result = import_instances(bad_instances(good), "bad.jsonl", known)
    assert result.imported == ["calc-add-sub-001", "known-repo"]
    kinds = [(type(error), error.where) for error in result.skipped]
    assert kinds == [
        (MalformedLine, "bad.jsonl:2"),
        (DuplicateInstance, "bad.jsonl:3 (calc-add-sub-001)"),
        (MissingImage, "bad.jsonl:4 (no-image)"),
        (UnknownRepository, "bad.jsonl:5 (unknown-repo)"),
        (UnknownRepository, "bad.jsonl:6 (unknown-parser)"),
        (UnknownTest, "bad.jsonl:7 (unknown-test)"),
        (BadTestName, "bad.jsonl:8 (django-style)"),
        (UnsupportedPatch, "bad.jsonl:9 (changes-tests)"),
    ]
    summary = result.summary()
    assert summary.splitlines()[0] == (
        "imported 2, skipped 8 (1 bad_test_name, 1 duplicate_instance_id, 1 malformed_json, 1 missing_image, "
        "2 unknown_repository, 1 unknown_test, 1 unsupported_patch)"
    )
    assert "test_nope, which calc==0's tests do not have" in summary
    assert "one JSON object a line" in summary
    assert "add a `log_parser`" in summary
    catalogue = result.catalogue
    assert catalogue is not None
    assert catalogue.sources["requests-2.31.0"].sdist == "requests==2.31.0"


def test_a_task_with_its_own_fix_patch_exports_that_patch() -> None:
    catalogue = parse_catalogue(CATALOGUE, "calc.yaml")
    task = catalogue.tasks[0]
    fixed = Task.model_validate({**task.model_dump(), "fix": {"patch": "diff --git a/x b/x\n@@ -1 +1 @@\n"}})
    bound = Catalogue(sources=catalogue.sources, tasks=[fixed])
    assert export_catalogue(bound, "img", "now")[0]["patch"] == "diff --git a/x b/x\n@@ -1 +1 @@\n"


def test_a_json_list_imports_and_a_broken_one_is_one_error(project: dict[str, object]) -> None:
    good = project["instance"]
    assert isinstance(good, dict)
    listed = import_instances(json.dumps([good, {**good, "instance_id": "other"}, 7]), "i.json")
    assert listed.imported == ["calc-add-sub-001", "other"]
    assert [(type(e), e.where) for e in listed.skipped] == [(MalformedLine, "i.json[2]")]
    broken = import_instances('[{"instance_id": "x",\n', "i.json")
    assert broken.catalogue is None
    assert [(type(e), e.where) for e in broken.skipped] == [(MalformedLine, "i.json:2")]
    odd = import_instances(json.dumps({**good, "log_parser": ["a list"]}) + "\n", "i.jsonl")
    assert [type(e) for e in odd.skipped] == [UnknownRepository]
