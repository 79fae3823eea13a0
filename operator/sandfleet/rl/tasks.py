"""The loop's tasks come from a task catalogue: real PyPI packages, a mined bug each, their own tests.

A catalogue (tasks/catalogue.yaml, docs/tasks.md) names pinned sdists and, per task, the bug as a
unique-anchor edit, the candidate edits an RL policy chooses from (the original among them) and
the test command. `from_catalogue` turns its edit bugs into `Task`s, each with the catalogue's
scoring (its deciding tests, run from the image's read-only copy of the tree); by default the loop, `serve
--local --tasks` and `rl build-tasks` use `DEFAULT_CATALOGUE` (tasks/ci.yaml, a subset of the
shipped catalogue that `task check` verifies in CI). The image lays each task's tree, with its bug
applied, under `/workspace/tasks/<task id>`; pytest travels as wheels in `/workspace/.deps` (the
image has no pip and no network), and the reward is the package's own named tests, run by
`evaluate` with the task's `scoring`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sandfleet.tasks.catalogue import WORKSPACE

REPO = Path(__file__).resolve().parents[3]
IMAGE_BUILD = REPO / "sandbox_image" / "build"
DEFAULT_CATALOGUE = REPO / "tasks" / "ci.yaml"
TEST_WHEELS = ("pytest==8.3.4", "pluggy==1.5.0", "iniconfig==2.0.0", "packaging==24.2")


class TaskBuildError(RuntimeError):
    """Reading the catalogue, or fetching and building the tasks, failed; the message says why."""


@dataclass(frozen=True)
class Task:
    """One bug in one real package, and the edits an agent may try on the broken text."""

    name: str
    sdist: str  # pip requirement, pinned
    directory: str  # top directory inside the sdist
    path: str  # file with the bug, relative to the package directory
    original: str  # the text as upstream wrote it
    broken: str  # the text after the catalogue's bug edit
    candidates: tuple[str, ...]  # replacements for the broken text; `original` is one of them
    command: str  # the source's test command (writes a JUnit report), run in the package directory
    timeout_s: float = 120.0  # the catalogue's per-run test timeout
    hidden_tests: tuple[tuple[str, str], ...] = ()  # (path, content): written only when scored
    # The `task` object of the evaluate request that scores it (Catalogue.scoring).
    scoring: Mapping[str, object] = field(default_factory=dict, hash=False, compare=False)

    @property
    def cwd(self) -> str:
        return f"{WORKSPACE}/tasks/{self.name}"

    @property
    def test_command(self) -> str:
        from sandfleet.tasks.mining import suite_pythonpath

        requires = f"{WORKSPACE}/.requires/{self.directory}"
        return f"PYTHONPATH={suite_pythonpath(f'{WORKSPACE}/.deps', requires)} {self.command}"

    @property
    def correct(self) -> int:
        return self.candidates.index(self.original)


def apply_edit(source: str, old: str, new: str) -> str:
    """`source` with the one occurrence of `old` replaced by `new` (ValueError if not exactly one)."""
    count = source.count(old)
    if count != 1:
        raise ValueError(f"the edit's anchor occurs {count} times, not once")
    return source.replace(old, new)


def cache_dir() -> Path:
    return Path(os.environ.get("SANDFLEET_CACHE", Path.home() / ".cache" / "sandfleet")) / "rl-tasks"


def pip_download(args: list[str], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--dest", str(dest), *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        raise TaskBuildError(f"pip download {' '.join(args)} failed: {result.stderr.strip()[-800:]}")


def prepare_workspace(
    tasks: tuple[Task, ...], root: Path | None = None, downloads: Path | None = None
) -> Path:
    """Fetch the sdists and test wheels (cached) and lay out the workspace with the bugs applied."""
    from sandfleet.tasks.mining import runtime_wheels, unpack_wheels

    root = root or cache_dir()
    downloads, workspace = downloads or root / "downloads", root / "workspace"
    for task in tasks:
        if not any(downloads.glob(f"{task.directory}.tar.gz")):
            pip_download(["--no-binary", ":all:", task.sdist], downloads)
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
        # Each package's own dependencies, on its own path (see tasks.mining.suite_pythonpath).
        requires = workspace / ".requires" / task.directory
        if not requires.is_dir():
            unpack_wheels(runtime_wheels(task.sdist, downloads), requires)
        with tarfile.open(downloads / f"{task.directory}.tar.gz") as archive:
            archive.extractall(workspace / "tasks", filter="data")
        unpacked = workspace / "tasks" / task.directory
        unpacked.rename(workspace / "tasks" / task.name)
        target = workspace / "tasks" / task.name / task.path
        try:
            target.write_text(apply_edit(target.read_text(), task.original, task.broken))
        except ValueError as error:
            raise TaskBuildError(f"task {task.name}: its bug edit does not apply: {error}") from None
    (workspace / "tasks.json").write_text(json.dumps([t.name for t in tasks]))
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
    """A catalogue's tasks (sdist sources, edit bugs with candidates) as the loop's tasks."""
    from sandfleet.tasks.catalogue import CatalogueError, parse_catalogue

    if not path.is_file():
        raise TaskBuildError(f"no task catalogue at {path}; pass --tasks CATALOGUE (tasks/catalogue.yaml)")
    try:
        catalogue = parse_catalogue(path.read_text(), str(path))
        chosen = catalogue.select(ids)
    except (OSError, CatalogueError, KeyError) as error:
        raise TaskBuildError(str(error).strip("'\"")) from None
    tasks = []
    for entry in chosen:
        source = catalogue.sources[entry.source]
        timeouts = entry.timeouts or source.timeouts
        edit = entry.bug.edit
        if source.sdist is None or source.directory is None or edit is None:
            raise TaskBuildError(f"task {entry.id}: the RL loop takes sdist sources with an edit bug")
        candidates = tuple(entry.candidates) or (edit.find, edit.replace)
        if edit.find not in candidates:
            raise TaskBuildError(f"task {entry.id}: its candidates must include the original text")
        try:
            source.pytest_args  # noqa: B018 - the named-tests rule needs a pytest command
        except ValueError as error:
            raise TaskBuildError(f"task {entry.id}: {error}") from None
        tasks.append(
            Task(
                name=entry.id,
                sdist=source.sdist,
                directory=source.directory,
                path=edit.file,
                original=edit.find,
                broken=edit.replace,
                candidates=candidates,
                command=source.test_command,
                timeout_s=timeouts.test_s,
                hidden_tests=tuple(sorted(entry.hidden_tests.items())),
                scoring=catalogue.scoring(entry),
            )
        )
    return tuple(tasks)


def load_tasks(catalogue: Path | None = None) -> tuple[Task, ...]:
    """A catalogue's tasks; without one, SANDFLEET_TASKS's (the product image sets it), else tasks/ci.yaml."""
    return from_catalogue(catalogue or Path(os.environ.get("SANDFLEET_TASKS") or DEFAULT_CATALOGUE))
