"""The loop's tasks come from a task catalogue: real PyPI packages, a mined bug each, their own tests.

A catalogue (tasks/catalogue.yaml, docs/tasks.md) names pinned sdists and, per task, the bug as a
unique-anchor edit, the candidate edits an RL policy chooses from (the original among them) and
the test command. `from_catalogue` checks that its tasks suit the loop (sdist sources, edit bugs,
the original among the choices, a pytest command) and returns them: the catalogue's own `Task`s,
each bound to its source, so each gives its `choices` and its `scoring` (its deciding tests, run
from the image's read-only copy of the tree). By default the loop, `serve --local --tasks` and
`rl build-tasks` use `DEFAULT_CATALOGUE` (tasks/ci.yaml, a subset of the shipped catalogue that
`task check` verifies in CI). The image lays each task's tree, with its bug applied, under
`/workspace/tasks/<task id>`; pytest travels as wheels in `/workspace/.deps` (the image has no pip
and no network), and the reward is the package's own named tests, run by `evaluate` with the
task's `scoring()`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

from sandfleet.tasks.catalogue import CatalogueError, Task, parse_catalogue
from sandfleet.tasks.fetching import TEST_WHEELS, TaskBuildError, pip_download
from sandfleet.tasks.mining import runtime_wheels, unpack_wheels

REPO = Path(__file__).resolve().parents[3]
IMAGE_BUILD = REPO / "sandbox_image" / "build"
DEFAULT_CATALOGUE = REPO / "tasks" / "ci.yaml"


def apply_edit(source: str, old: str, new: str) -> str:
    """`source` with the one occurrence of `old` replaced by `new` (ValueError if not exactly one)."""
    count = source.count(old)
    if count != 1:
        raise ValueError(f"the edit's anchor occurs {count} times, not once")
    return source.replace(old, new)


def cache_dir() -> Path:
    return Path(os.environ.get("SANDFLEET_CACHE", Path.home() / ".cache" / "sandfleet")) / "rl-tasks"


def sdist_of(task: Task) -> tuple[str, str]:
    """The task's pinned sdist and its top directory; TaskBuildError unless the loop can take the task."""
    source = task.source_entry
    if source.sdist is None or source.directory is None or task.bug.edit is None:
        raise TaskBuildError(f"task {task.id}: the RL loop takes sdist sources with an edit bug")
    return source.sdist, source.directory


def prepare_workspace(
    tasks: tuple[Task, ...], root: Path | None = None, downloads: Path | None = None
) -> Path:
    """Fetch the sdists and test wheels (cached) and lay out the workspace with the bugs applied."""
    root = root or cache_dir()
    downloads, workspace = downloads or root / "downloads", root / "workspace"
    for task in tasks:
        sdist, directory = sdist_of(task)
        if not any(downloads.glob(f"{directory}.tar.gz")):
            pip_download(["--no-binary", ":all:", sdist], downloads)
    if not all(any(downloads.glob(f"{w.split('==')[0]}-*.whl")) for w in TEST_WHEELS):
        pip_download(["--only-binary", ":all:", *TEST_WHEELS], downloads)
    shutil.rmtree(workspace, ignore_errors=True)
    (workspace / "tasks").mkdir(parents=True)
    for pin in TEST_WHEELS:
        name, version = pin.split("==")
        for wheel in downloads.glob(f"{name}-{version}-*.whl"):
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(workspace / ".deps")
    for task in tasks:
        sdist, directory = sdist_of(task)
        # Each package's own dependencies, on its own path (see tasks.catalogue.suite_pythonpath).
        requires = workspace / ".requires" / directory
        if not requires.is_dir():
            unpack_wheels(runtime_wheels(sdist, downloads), requires)
        with tarfile.open(downloads / f"{directory}.tar.gz") as archive:
            archive.extractall(workspace / "tasks", filter="data")
        unpacked = workspace / "tasks" / directory
        unpacked.rename(workspace / "tasks" / task.id)
        target = workspace / "tasks" / task.id / task.bug_edit.file
        try:
            target.write_text(apply_edit(target.read_text(), task.original, task.broken))
        except ValueError as error:
            raise TaskBuildError(f"task {task.id}: its bug edit does not apply: {error}") from None
    (workspace / "tasks.json").write_text(json.dumps([t.id for t in tasks]))
    return workspace


def image_name(catalogue: Path) -> str:
    """The task image's name for a catalogue (`tasks-ci` for the default one)."""
    return f"tasks-{catalogue.stem}"


def build_image(tasks: tuple[Task, ...], name: str) -> dict[str, str]:
    """Build (or find cached) the task image on top of the base image; its JSON description."""
    workspace = prepare_workspace(tasks)
    argv = [str(IMAGE_BUILD), "--json", "task", "--name", name, "--workspace", str(workspace)]
    result = subprocess.run(argv, stdout=subprocess.PIPE, text=True, timeout=1800, check=False)
    if result.returncode != 0:
        raise TaskBuildError("sandbox_image/build task failed (its output is above)")
    data: dict[str, str] = json.loads(result.stdout.strip().splitlines()[-1])
    return data


def from_catalogue(path: Path, ids: list[str] | None = None) -> tuple[Task, ...]:
    """A catalogue's tasks (those with `ids`, else all), checked to be ones the loop can run."""
    if not path.is_file():
        raise TaskBuildError(f"no task catalogue at {path}; pass --tasks CATALOGUE (tasks/catalogue.yaml)")
    try:
        catalogue = parse_catalogue(path.read_text(), str(path))
        chosen = catalogue.select(ids)
    except (OSError, CatalogueError, KeyError) as error:
        raise TaskBuildError(str(error).strip("'\"")) from None
    for task in chosen:
        sdist_of(task)  # an sdist source with an edit bug, or TaskBuildError
        if task.original not in task.choices:
            raise TaskBuildError(f"task {task.id}: its candidates must include the original text")
        try:
            task.source_entry.pytest_args  # noqa: B018 - the named-tests rule needs a pytest command
        except ValueError as error:
            raise TaskBuildError(f"task {task.id}: {error}") from None
    return tuple(chosen)


def load_tasks(catalogue: Path | None = None) -> tuple[Task, ...]:
    """A catalogue's tasks; without one, SANDFLEET_TASKS's (the product image sets it), else tasks/ci.yaml."""
    return from_catalogue(catalogue or Path(os.environ.get("SANDFLEET_TASKS") or DEFAULT_CATALOGUE))
