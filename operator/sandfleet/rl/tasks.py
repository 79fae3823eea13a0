"""Real tasks: open-source packages from PyPI with a bug of ours; the package's own tests are the reward.

Each task is a source distribution fetched at image build time (`pip download --no-binary`), unpacked
into `/workspace/tasks/<name>`, with one line broken by us. The agent's actions are candidate edits
of that line (one restores the original); the reward is the package's own tests, run in the sandbox
by `evaluate`. pytest travels as wheels in `/workspace/.deps` (the image has no pip and no network).

The three built-in tasks below are the default. Any catalogue (tasks/catalogue.yaml, docs/tasks.md)
replaces them: `from_catalogue` turns its edit bugs into the same `Task`s, and
`sandfleet rl build-tasks --tasks CATALOGUE` builds their image.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
IMAGE_BUILD = REPO / "sandbox_image" / "build"
IMAGE_NAME = "sandfleet-rl-tasks"
WORKSPACE = "/workspace"
TEST_WHEELS = ("pytest==8.3.4", "pluggy==1.5.0", "iniconfig==2.0.0", "packaging==24.2")


class TaskBuildError(RuntimeError):
    """Fetching or building the tasks failed; the message says which step and why."""


@dataclass(frozen=True)
class Task:
    """One bug in one real package, and the edits an agent may try on the broken line."""

    name: str
    sdist: str  # pip requirement, pinned
    directory: str  # top directory inside the sdist
    path: str  # file with the bug, relative to the package directory
    original: str  # the line as upstream wrote it
    broken: str  # the line after our bug patch
    candidates: tuple[str, ...]  # replacements for the broken line; `original` is one of them
    tests: str  # the package's own tests, run in the package directory
    command: str = ""  # a catalogue task's whole test command (then `tests` is unused)

    @property
    def cwd(self) -> str:
        return f"{WORKSPACE}/tasks/{self.name}"

    @property
    def test_command(self) -> str:
        if self.command:
            return f"PYTHONPATH={WORKSPACE}/.deps:. {self.command}"
        return f"PYTHONPATH={WORKSPACE}/.deps:. python3 -m pytest -q -rA -p no:cacheprovider {self.tests}"

    @property
    def correct(self) -> int:
        return self.candidates.index(self.original)


TASKS: tuple[Task, ...] = (
    Task(
        name="inflection-ordinal",
        sdist="inflection==0.5.1",
        directory="inflection-0.5.1",
        path="inflection/__init__.py",
        original="    if number % 100 in (11, 12, 13):",
        broken="    if number % 10 in (11, 12, 13):",
        candidates=(
            "    if number % 10 in (1, 2, 3):",
            "    if number in (11, 12, 13):",
            "    if number % 100 in (11, 12, 13):",
            "    if number % 100 in (10, 11, 12):",
        ),
        tests="test_inflection.py -k ordinal",
    ),
    Task(
        name="toolz-frequencies",
        sdist="toolz==1.0.0",
        directory="toolz-1.0.0",
        path="toolz/itertoolz.py",
        original="        d[item] += 1",
        broken="        d[item] = 1",
        candidates=(
            "        d[item] -= 1",
            "        d[item] = 2",
            "        d[item] += 1",
            "        d[item] *= 2",
        ),
        tests="toolz/tests/test_itertoolz.py -k frequencies",
    ),
    Task(
        name="more-itertools-first",
        sdist="more-itertools==10.5.0",
        directory="more-itertools-10.5.0",
        path="more_itertools/more.py",
        original="    for item in iterable:\n        return item\n    if default is _marker:\n"
        "        raise ValueError(\n            'first() was",
        broken="    for item in iterable:\n        break\n    if default is _marker:\n"
        "        raise ValueError(\n            'first() was",
        candidates=(
            "    for item in iterable:\n        return item\n    if default is _marker:\n"
            "        raise ValueError(\n            'first() was",
            "    for item in iterable:\n        return default\n    if default is _marker:\n"
            "        raise ValueError(\n            'first() was",
            "    for item in iterable:\n        continue\n    if default is _marker:\n"
            "        raise ValueError(\n            'first() was",
            "    for item in iterable:\n        return iterable\n    if default is _marker:\n"
            "        raise ValueError(\n            'first() was",
        ),
        tests="tests/test_more.py -k FirstTests",
    ),
)


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
    tasks: tuple[Task, ...] = TASKS, root: Path | None = None, downloads: Path | None = None
) -> Path:
    """Fetch the sdists and test wheels (cached) and lay out the workspace with our bugs applied."""
    root = root or cache_dir()
    downloads, workspace = downloads or root / "downloads", root / "workspace"
    for task in tasks:
        if not any(downloads.glob(f"{task.directory}.tar.gz")):
            pip_download(["--no-binary", ":all:", task.sdist], downloads)
    if not all(any(downloads.glob(f"{w.split('==')[0]}-*.whl")) for w in TEST_WHEELS):
        pip_download(["--only-binary", ":all:", *TEST_WHEELS], downloads)
    shutil.rmtree(workspace, ignore_errors=True)
    (workspace / "tasks").mkdir(parents=True)
    for wheel in sorted(downloads.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(workspace / ".deps")
    for task in tasks:
        with tarfile.open(downloads / f"{task.directory}.tar.gz") as archive:
            archive.extractall(workspace / "tasks", filter="data")
        unpacked = workspace / "tasks" / task.directory
        unpacked.rename(workspace / "tasks" / task.name)
        target = workspace / "tasks" / task.name / task.path
        try:
            target.write_text(apply_edit(target.read_text(), task.original, task.broken))
        except ValueError as error:
            raise TaskBuildError(f"task {task.name}: our bug patch does not apply: {error}") from None
    (workspace / "tasks.json").write_text(json.dumps([t.name for t in tasks]))
    return workspace


def build_image(tasks: tuple[Task, ...] = TASKS, name: str = IMAGE_NAME) -> dict[str, str]:
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

    try:
        catalogue = parse_catalogue(path.read_text(), str(path))
        chosen = catalogue.select(ids)
    except (OSError, CatalogueError, KeyError) as error:
        raise TaskBuildError(str(error).strip("'\"")) from None
    tasks = []
    for entry in chosen:
        source = catalogue.sources[entry.source]
        edit = entry.bug.edit
        if source.sdist is None or source.directory is None or edit is None:
            raise TaskBuildError(f"task {entry.id}: the RL loop takes sdist sources with an edit bug")
        candidates = tuple(entry.candidates) or (edit.find, edit.replace)
        if edit.find not in candidates:
            raise TaskBuildError(f"task {entry.id}: its candidates must include the original text")
        tasks.append(
            Task(
                name=entry.id,
                sdist=source.sdist,
                directory=source.directory,
                path=edit.file,
                original=edit.find,
                broken=edit.replace,
                candidates=candidates,
                tests="",
                command=source.test_command,
            )
        )
    return tuple(tasks)


def by_name(name: str) -> Task:
    for task in TASKS:
        if task.name == name:
            return task
    raise KeyError(f"no task {name!r}; tasks are: {', '.join(t.name for t in TASKS)}")
