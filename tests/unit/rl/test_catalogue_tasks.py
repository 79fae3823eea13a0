"""The RL loop's tasks are a catalogue's own, checked: sdist sources, edit bugs, the original a choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandfleet.rl.catalogue_tasks import (
    DEFAULT_CATALOGUE,
    apply_edit,
    from_catalogue,
    image_name,
    load_tasks,
    sdist_of,
)
from sandfleet.tasks.catalogue import parse_catalogue
from sandfleet.tasks.fetching import TaskBuildError
from tests.unit.tasks.test_catalogue import VALID

REPO = Path(__file__).resolve().parents[3]


def test_a_catalogues_tasks_become_loop_tasks(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(VALID)
    (task,) = from_catalogue(path)
    assert task == parse_catalogue(VALID, str(path)).tasks[0]  # the catalogue's own task
    assert sdist_of(task) == ("demo==1.0", "demo-1.0")
    assert task.choices[task.correct_choice] == "x < 1"
    assert apply_edit("if x >= 1:", task.broken, task.original) == "if x < 1:"


def test_the_shipped_catalogue_is_loop_ready() -> None:
    tasks = from_catalogue(REPO / "tasks" / "catalogue.yaml")
    assert len({t.id for t in tasks}) == len(tasks)
    assert all(t.choices[t.correct_choice] == t.original and t.broken in t.choices for t in tasks)


def test_a_bad_catalogue_or_id_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(VALID.replace("sdist: demo==1.0", "sdist: demo"))
    with pytest.raises(TaskBuildError, match=r"c.yaml:4: sources.demo-1.0.sdist"):
        from_catalogue(path)
    path.write_text(VALID)
    with pytest.raises(TaskBuildError, match="no task nope"):
        from_catalogue(path, ["nope"])


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [
        ("sdist: demo==1.0", "dir: demo", "the RL loop takes sdist sources with an edit bug"),
        (
            "fail_to_pass: [t::a]",
            "fail_to_pass: [t::a]\n    candidates: [x > 1, x >= 1]",
            "include the original",
        ),
        ("tests_passing:", "test_command: make test\n    tests_passing:", "must run pytest"),
    ],
)
def test_a_task_the_loop_cannot_run_is_refused_by_name(
    tmp_path: Path, old: str, new: str, words: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(VALID.replace(old, new))
    with pytest.raises(TaskBuildError, match=f"task demo-1.0-one: .*{words}"):
        from_catalogue(path)


def test_the_default_tasks_are_the_ci_catalogues() -> None:
    tasks = load_tasks()
    expected = parse_catalogue(DEFAULT_CATALOGUE.read_text(), str(DEFAULT_CATALOGUE))
    assert DEFAULT_CATALOGUE == REPO / "tasks" / "ci.yaml"
    assert [t.id for t in tasks] == [t.id for t in expected.tasks]
    assert all(t.choices[t.correct_choice] == t.original and t.broken in t.choices for t in tasks)
    assert image_name(DEFAULT_CATALOGUE) == "tasks-ci"  # the image `task check` verifies in CI


def test_a_missing_catalogue_says_to_pass_one(tmp_path: Path) -> None:
    with pytest.raises(TaskBuildError, match=r"no task catalogue at .*nope.yaml; pass --tasks"):
        load_tasks(tmp_path / "nope.yaml")
