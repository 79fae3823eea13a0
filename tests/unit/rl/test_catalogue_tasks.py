"""The RL loop's tasks from a catalogue: each edit bug becomes a task whose candidates hold the original."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandfleet.rl.tasks import (
    DEFAULT_CATALOGUE,
    TaskBuildError,
    apply_edit,
    from_catalogue,
    image_name,
    load_tasks,
)
from sandfleet.tasks.catalogue import parse_catalogue
from tests.unit.tasks.test_catalogue import VALID

REPO = Path(__file__).resolve().parents[3]


def test_a_catalogues_tasks_become_loop_tasks(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(VALID)
    (task,) = from_catalogue(path)
    assert task.name == "demo-1.0-one"
    assert task.directory == "demo-1.0"
    assert task.sdist == "demo==1.0"
    assert task.candidates[task.correct] == "x < 1"
    assert apply_edit("if x >= 1:", task.broken, task.original) == "if x < 1:"
    assert task.test_command.endswith("python3 -m pytest -q -p no:cacheprovider")
    assert task.cwd == "/workspace/tasks/demo-1.0-one"


def test_the_shipped_catalogue_is_loop_ready() -> None:
    tasks = from_catalogue(REPO / "tasks" / "catalogue.yaml")
    assert len({t.name for t in tasks}) == len(tasks)
    assert all(t.candidates[t.correct] == t.original and t.broken in t.candidates for t in tasks)


def test_a_bad_catalogue_or_id_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(VALID.replace("sdist: demo==1.0", "sdist: demo"))
    with pytest.raises(TaskBuildError, match=r"c.yaml:4: sources.demo-1.0.sdist"):
        from_catalogue(path)
    path.write_text(VALID)
    with pytest.raises(TaskBuildError, match="no task nope"):
        from_catalogue(path, ["nope"])


def test_the_default_tasks_are_the_ci_catalogues() -> None:
    tasks = load_tasks()
    expected = parse_catalogue(DEFAULT_CATALOGUE.read_text(), str(DEFAULT_CATALOGUE))
    assert DEFAULT_CATALOGUE == REPO / "tasks" / "ci.yaml"
    assert [t.name for t in tasks] == [t.id for t in expected.tasks]
    assert all(t.candidates[t.correct] == t.original and t.broken in t.candidates for t in tasks)
    assert image_name(DEFAULT_CATALOGUE) == "tasks-ci"  # the image `task check` verifies in CI


def test_a_missing_catalogue_says_to_pass_one(tmp_path: Path) -> None:
    with pytest.raises(TaskBuildError, match=r"no task catalogue at .*nope.yaml; pass --tasks"):
        load_tasks(tmp_path / "nope.yaml")
