"""Scores a task by its deciding tests, in a tree made of the task's own copy plus the episode's source edits.

`evaluate` with a `task` object lands here. The episode's tree is never run as it is: a fresh
scoring tree is copied from the task's pristine copy (root's, read-only, laid in the image), and
only the episode's changes to source files are carried over. Test files, test configuration,
caches, links and new modules that could shadow an import are the task's (deciding.py says which);
what the episode did to them is reported, not used. The suite then runs as the verifier through
verdict_runner.py, with an environment built from nothing (a fixed PATH, the task's PYTHONPATH of
root-owned directories, no user site), and its results stream decides the reward (deciding.py).
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path

from sandfleet_agent import deciding, wire
from sandfleet_agent.errors import AgentError, bad_request, unprocessable
from sandfleet_agent.paths import Workspace
from sandfleet_agent.process import ExecSpec, ProcessResult, render_output, run
from sandfleet_agent.users import Identity, end_processes

RUNNER = Path(__file__).with_name("verdict_runner.py")
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_TIMEOUT_S = 1800.0
MAX_TIMEOUT_S = 24 * 3600.0
MAX_CARRIED_FILES = 20_000
MAX_CARRIED_BYTES = 256 << 20
MAX_RESULTS_BYTES = 64 << 20
OUTPUT_BYTES = 1 << 20
OUTPUT_TAIL_BYTES = 64 << 10
# World-writable places a test could read a planted file from; emptied of the episode's files.
TEMP_DIRS = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


@dataclass(frozen=True)
class TaskSpec:
    """What a task says about scoring it (the `task` object of an evaluate request)."""

    tree: Path  # the episode's tree, in the working area
    pristine: Path  # the task's own copy of that tree: root's, read-only
    deciding: tuple[str, ...]  # JUnit names (`classname::name`) of FAIL_TO_PASS + PASS_TO_PASS
    test_paths: tuple[str, ...] = ()
    pytest_args: tuple[str, ...] = ()
    pythonpath: tuple[str, ...] = (".",)  # "." is the scoring tree; others root-owned directories
    files: tuple[tuple[str, str], ...] = ()  # written into the scoring tree (tests the policy never saw)
    python: str = "python3"
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass
class Carried:
    """What of the episode's tree went into the scoring tree, and what was left out and why."""

    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)

    def report(self) -> dict[str, object]:
        return {"changed": self.changed, "deleted": self.deleted}


class TooBig(Exception):
    """The episode changed more than scoring carries: a refusal the episode caused."""


def parse_task(raw: object, workspace: Workspace) -> TaskSpec:
    """Validate the `task` object; bad input is a 400 naming the field."""
    if not isinstance(raw, dict):
        raise bad_request(
            "'task' must be an object: tree, pristine, deciding, ... (docs/tasks.md)", "bad_task"
        )
    known = {"tree", "pristine", "deciding", "test_paths", "pytest_args", "pythonpath", "files", "python"}
    known |= {"timeout_s"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise bad_request(f"'task' has unknown fields {unknown}; it takes {sorted(known)}", "bad_task")
    tree = workspace.resolve(_string(raw, "tree"))
    if not tree.is_dir():
        raise unprocessable(f"task.tree {workspace.relative(tree)!r} is not a directory", "bad_task")
    pristine = Path(_string(raw, "pristine"))
    if not pristine.is_absolute():
        raise bad_request("task.pristine must be an absolute path (the task's root-owned copy)", "bad_task")
    deciding_tests = tuple(_strings(raw, "deciding"))
    if not deciding_tests:
        raise bad_request("task.deciding must name at least one test (`classname::name`)", "bad_task")
    files = raw.get("files") or {}
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise bad_request("task.files must map relative paths to their text", "bad_task")
    timeout = raw.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_TIMEOUT_S:
        raise bad_request(
            f"task.timeout_s must be a number of seconds in (0, {MAX_TIMEOUT_S:.0f}]", "bad_task"
        )
    pythonpath = tuple(_strings(raw, "pythonpath")) or (".",)
    for entry in pythonpath:
        if entry != "." and not os.path.isabs(entry):
            raise bad_request(f"task.pythonpath entries are '.' or absolute paths, not {entry!r}", "bad_task")
    return TaskSpec(
        tree=tree,
        pristine=pristine,
        deciding=deciding_tests,
        test_paths=tuple(_relative(p, "test_paths") for p in _strings(raw, "test_paths")),
        pytest_args=tuple(_strings(raw, "pytest_args")),
        pythonpath=pythonpath,
        files=tuple(sorted((_relative(k, "files"), v) for k, v in files.items())),
        python=str(raw.get("python") or "python3"),
        timeout_s=float(timeout),
    )


def _string(raw: Mapping[str, object], key: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value:
        raise bad_request(f"task.{key} must be a non-empty string", "bad_task")
    return value


def _strings(raw: Mapping[str, object], key: str) -> list[str]:
    value = raw.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise bad_request(f"task.{key} must be a list of non-empty strings", "bad_task")
    return list(value)


def _relative(path: str, key: str) -> str:
    parts = [p for p in path.strip("/").split("/") if p not in ("", ".")] if not path.startswith("/") else []
    if not parts or ".." in parts or "\x00" in path:
        raise bad_request(f"task.{key}: {path!r} must be a relative path inside the tree", "bad_task")
    return "/".join(parts)


# -- what only root may change ---------------------------------------------------------------------


def check_root_only(path: Path, what: str) -> None:
    """`path` and every directory above it are root's and writable by nobody else, with no link on the way."""
    current = Path("/")
    for part in path.parts[1:]:
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            raise unprocessable(f"{what} {str(path)!r} does not exist", "bad_task") from None
        if stat.S_ISLNK(info.st_mode):
            raise unprocessable(f"{what} {str(path)!r} passes through a link at {str(current)!r}", "bad_task")
        # A sticky directory of root's (/tmp) lets others add entries, never replace root's own.
        sticky = current != path and info.st_mode & stat.S_ISVTX
        if info.st_uid != 0 or (info.st_mode & _WRITABLE_BY_OTHERS and not sticky):
            raise unprocessable(
                f"{what} {str(path)!r} is not root's read-only copy: {str(current)!r} may be changed by "
                "others (the task's copy must be laid by the image as root's)",
                "bad_task",
            )


_checked_trees: set[Path] = set()


def check_tree_root_only(path: Path, what: str) -> None:
    """Like check_root_only, and nothing inside the tree is another user's (checked once per path)."""
    check_root_only(path, what)
    if path in _checked_trees or os.geteuid() != 0:
        return
    for directory, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            info = os.lstat(os.path.join(directory, name))
            if info.st_uid != 0 or (not stat.S_ISLNK(info.st_mode) and info.st_mode & _WRITABLE_BY_OTHERS):
                raise unprocessable(
                    f"{what} {str(path)!r} holds {os.path.join(directory, name)!r}, "
                    "which is not root's read-only",
                    "bad_task",
                )
    _checked_trees.add(path)


def find_python(name: str) -> str:
    """The interpreter's absolute path, from the fixed PATH only, in a directory only root may change."""
    candidates = [Path(name)] if os.path.isabs(name) else [Path(d) / name for d in SAFE_PATH.split(":")]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            check_root_only(candidate.parent, "the interpreter's directory")
            return str(candidate)
    raise unprocessable(f"no {name!r} on {SAFE_PATH} to run the task's tests with", wire.COMMAND_NOT_FOUND)


# -- the scoring tree ------------------------------------------------------------------------------


def _entries(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry under `root` (relative path, lstat), links listed but never followed."""
    for directory, dirs, files in os.walk(root):
        base = Path(directory)
        for name in list(dirs):
            info = os.lstat(base / name)
            if stat.S_ISLNK(info.st_mode):
                dirs.remove(name)
                files.append(name)
            elif name in deciding.CACHE_DIRS:
                dirs.remove(name)  # caches are the task's: never read from the episode
        for name in files:
            path = base / name
            yield str(path.relative_to(root)), os.lstat(path)


def _read(path: Path, limit: int) -> bytes:
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError("not a regular file")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise TooBig(f"{path.name} is over {limit} bytes")
    return data


def build_tree(
    episode: Path,
    pristine: Path,
    target: Path,
    test_paths: tuple[str, ...],
    deciding_tests: tuple[str, ...],
    author: int | None = None,
) -> Carried:
    """Copy `pristine` to `target`, then carry over the episode's changes to source files only.

    The test infrastructure is the task's `test_paths`, the directories of its deciding tests'
    modules, and what deciding.infrastructure names anywhere. With `author` (the sandbox user's
    uid), a changed file is carried only if it is that user's: a hard link to a file of root's
    must not carry root's data into a tree the code under test can read.
    """
    carried = Carried()
    shutil.copytree(pristine, target, symlinks=True)
    known: dict[str, os.stat_result] = dict(_entries(pristine))
    test_paths = (*test_paths, *deciding.deciding_test_paths(deciding_tests, frozenset(known)))
    packages = frozenset(
        str(Path(rel).parent) if "/" in rel else "" for rel in known if Path(rel).name == "__init__.py"
    )
    seen: set[str] = set()
    budget = MAX_CARRIED_BYTES
    for relative, info in _entries(episode):
        seen.add(relative)
        before = known.get(relative)
        why = deciding.infrastructure(relative, test_paths)
        if why is not None:
            if before is None or not _same(episode / relative, info, pristine / relative, before):
                carried.dropped.append((relative, why))
            continue
        if before is not None and _same(episode / relative, info, pristine / relative, before):
            continue
        if stat.S_ISLNK(info.st_mode):
            carried.dropped.append((relative, "a link (links are never carried into scoring)"))
        elif not stat.S_ISREG(info.st_mode):
            carried.dropped.append((relative, "not a regular file"))
        elif before is not None and not stat.S_ISREG(before.st_mode):
            carried.dropped.append((relative, "a file where the task has a link or something else"))
        elif before is None and deciding.shadows(relative, packages):
            carried.dropped.append((relative, "a new module outside a package (it could shadow an import)"))
        elif author is not None and info.st_uid != author:
            carried.dropped.append((relative, f"a file of uid {info.st_uid}, not the episode's"))
        else:
            if len(carried.changed) >= MAX_CARRIED_FILES:
                raise TooBig(f"the episode changed more than {MAX_CARRIED_FILES} files")
            try:
                data = _read(episode / relative, budget)
            except OSError:
                carried.dropped.append((relative, "unreadable"))
                continue
            budget -= len(data)
            _write(target, relative, data, info.st_mode & stat.S_IXUSR != 0)
            carried.changed.append(relative)
    for relative in known:
        if relative in seen:
            continue
        why = deciding.infrastructure(relative, test_paths)
        if why is not None:
            if not _cache(relative):
                carried.dropped.append((relative, f"deleted: {why}"))
            continue
        carried.deleted.append(relative)
        (target / relative).unlink()
    return carried


def _cache(relative: str) -> bool:
    parts = relative.split("/")
    return any(p in deciding.CACHE_DIRS for p in parts) or relative.endswith((".pyc", ".pyo"))


def _same(path: Path, info: os.stat_result, other: Path, before: os.stat_result) -> bool:
    if stat.S_IFMT(info.st_mode) != stat.S_IFMT(before.st_mode):
        return False
    if stat.S_ISLNK(info.st_mode):
        return os.readlink(path) == os.readlink(other)
    if not stat.S_ISREG(info.st_mode):
        return False
    if info.st_size != before.st_size:
        return False
    if info.st_mtime_ns == before.st_mtime_ns:
        # The image lays the working area and the pristine copy with the same times, and any write
        # sets a new one, so this skips reading both copies of every file (a third of the scoring
        # tree's time in gVisor). An episode that puts an edited file's time back only keeps its
        # own edit out of scoring, which gets the task's pristine file instead: never a pass.
        return True
    try:
        return _read(path, info.st_size) == _read(other, before.st_size)
    except (OSError, TooBig):
        return False


def _write(target: Path, relative: str, data: bytes, executable: bool) -> None:
    path = target / relative
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.is_symlink():
        path.unlink()
    path.write_bytes(data)
    os.chmod(path, 0o755 if executable else 0o644)


def write_files(target: Path, files: tuple[tuple[str, str], ...]) -> None:
    for relative, text in files:
        _write(target, relative, text.encode(), False)


def give(path: Path, owner: Identity | None) -> None:
    """Hand a directory tree to `owner` (the verifier), so the suite may write into it as projects do."""
    if owner is None:
        return
    os.lchown(path, owner.uid, owner.gid)
    for directory, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.lchown(os.path.join(directory, name), owner.uid, owner.gid)


def clean_temp(users: tuple[Identity | None, ...], places: tuple[Path, ...] = TEMP_DIRS) -> list[str]:
    """Remove what the episode's users left in the world-writable temporary directories."""
    uids = {user.uid for user in users if user is not None}
    removed: list[str] = []
    if not uids:
        return removed
    for place in places:
        try:
            entries = list(os.scandir(place))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid not in uids:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed.append(entry.path)
            except OSError:
                continue
    return removed


# -- the run ------------------------------------------------------------------------------------


@dataclass
class Run:
    """One run of the verdict runner: the process's result and its results stream."""

    result: ProcessResult
    stream: deciding.Stream
    argv: list[str]


def run_suite(spec: TaskSpec, tree: Path, scratch: Path, user: Identity | None, python: str) -> Run:
    """Run the task's pytest through the verdict runner in `tree`, as `user`; read its results stream."""
    nonce = secrets.token_hex(16)
    home, tmp = scratch / "home", scratch / "tmp"
    for directory in (home, tmp):
        directory.mkdir(mode=0o700)
        give(directory, user)
    entries = [str(tree) if entry == "." else entry for entry in spec.pythonpath]
    env = {
        "PATH": SAFE_PATH,
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "LANG": "C.UTF-8",
        "PYTHONPATH": ":".join(entries),
        "PYTHONNOUSERSITE": "1",
    }
    read_end, write_end = os.pipe()
    argv = [python, "-P", str(RUNNER), str(write_end), "--", *spec.pytest_args]
    collected = bytearray()

    def drain() -> None:
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            while chunk := pipe.read(1 << 16):
                if len(collected) < MAX_RESULTS_BYTES:
                    collected.extend(chunk)

    reader = threading.Thread(target=drain, name="verdict-results", daemon=True)
    reader.start()
    closed = False

    def close_write_end(_: object) -> None:
        nonlocal closed
        os.close(write_end)
        closed = True

    exec_spec = ExecSpec(
        argv=argv,
        cwd=tree,
        env=env,
        stdin=(nonce + "\n").encode(),
        timeout_s=spec.timeout_s,
        max_output_bytes=OUTPUT_BYTES,
        encoding="utf-8",
        user=user,
        pass_fds=(write_end,),
    )
    try:
        result = run(exec_spec, on_start=close_write_end)
    finally:
        if not closed:
            os.close(write_end)
    end_processes(user)  # what the run left behind would hold the results pipe open
    reader.join(10.0)
    stream = deciding.read_stream(bytes(collected), nonce)
    if len(collected) >= MAX_RESULTS_BYTES:
        stream.tampered.append(f"the results stream passed {MAX_RESULTS_BYTES} bytes")
    return Run(result, stream, argv)


# -- the whole scoring -------------------------------------------------------------------------------

# Whether each task's harness gives a verdict on its own pristine tree, by what runs it.
_harness_verdicts: dict[tuple[object, ...], bool] = {}


def score(
    spec: TaskSpec, scratch_root: Path, verifier: Identity | None, exec_user: Identity | None
) -> dict[str, object]:
    """Build the scoring tree, run the suite, decide; the evaluate report's task-specific fields."""
    started = time.monotonic()
    check_tree_root_only(spec.pristine, "task.pristine")
    for entry in spec.pythonpath:
        if entry != ".":
            check_tree_root_only(Path(entry), "task.pythonpath entry")
    python = find_python(spec.python)
    removed = clean_temp((exec_user, verifier))
    scratch = _fresh_scratch(scratch_root)
    try:
        tree = scratch / "tree"
        try:
            author = exec_user.uid if exec_user is not None else None
            carried = build_tree(spec.tree, spec.pristine, tree, spec.test_paths, spec.deciding, author)
        except TooBig as error:
            return _refused(str(error), started)
        write_files(tree, spec.files)
        give(tree, verifier)
        prepared = time.monotonic()
        ran = run_suite(spec, tree, scratch, verifier, python)
        tests_done = time.monotonic()
        decision = deciding.decide(
            ran.stream,
            spec.deciding,
            exit_code=ran.result.exit_code,
            signal=ran.result.signal,
            timed_out=ran.result.timed_out,
        )
        outcome, reason = decision.outcome, decision.reason
        if decision.harness_suspect and not _harness_gives_verdict(spec, scratch_root, verifier, python):
            outcome = wire.INFRA_ERROR
            reason = f"the task's harness gives no verdict on its own pristine tree either ({reason})"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    tampered = [f"{path}: {why}" for path, why in carried.dropped] + [f"left in {place}" for place in removed]
    return {
        "outcome": outcome,
        "reward": decision.reward if outcome != wire.INFRA_ERROR else 0.0,
        "reward_source": wire.DECIDING_TESTS,
        "outcome_reason": reason,
        "deciding": {
            "total": len(spec.deciding),
            "passed": len(spec.deciding) - len(decision.not_passing),
            "not_passing": [{"name": n, "outcome": o} for n, o in decision.not_passing[:50]],
        },
        "tampered": [*tampered, *ran.stream.tampered],
        "carried": carried.report(),
        "tests": [
            {
                "name": name,
                "outcome": phases.outcome,
                "duration_s": round(ran.stream.durations.get(name, 0.0), 6),
            }
            for name, phases in ran.stream.tests.items()
        ],
        "counts": deciding.counts(ran.stream),
        "tests_report": None,
        "exec": {
            **ran.result.summary(),
            "argv": ran.argv,
            "stdout_tail": render_output(ran.result.stdout[-OUTPUT_TAIL_BYTES:], "utf-8"),
            "stderr_tail": render_output(ran.result.stderr[-OUTPUT_TAIL_BYTES:], "utf-8"),
        },
        "durations": {
            "prepare_s": round(prepared - started, 6),
            "tests_s": round(tests_done - prepared, 6),
        },
    }


def _refused(why: str, started: float) -> dict[str, object]:
    return {
        "outcome": wire.FAILED,
        "reward": 0.0,
        "reward_source": wire.DECIDING_TESTS,
        "outcome_reason": f"the episode's tree cannot be scored: {why}",
        "deciding": {},
        "tampered": [why],
        "carried": {},
        "tests": [],
        "counts": {},
        "tests_report": None,
        "exec": {},
        "durations": {"prepare_s": round(time.monotonic() - started, 6), "tests_s": 0.0},
    }


def _fresh_scratch(root: Path) -> Path:
    """An empty directory for one scoring: root's and closed to others, so the episode sees nothing of it."""
    try:
        root.mkdir(mode=0o711, parents=True, exist_ok=True)
        scratch = root / f"score-{secrets.token_hex(6)}"
        scratch.mkdir(mode=0o711)
    except OSError as error:
        raise AgentError(
            HTTPStatus.UNPROCESSABLE_ENTITY,
            wire.VERIFIER_DIR_UNWRITABLE,
            f"cannot prepare {str(root)!r}: {error}",
        ) from None
    return scratch


def _harness_gives_verdict(
    spec: TaskSpec, scratch_root: Path, verifier: Identity | None, python: str
) -> bool:
    """Whether the suite gives a verdict on the task's pristine tree (run once per task, remembered)."""
    key = (spec.pristine, spec.pythonpath, spec.pytest_args, spec.files, spec.deciding, python)
    if key not in _harness_verdicts:
        scratch = _fresh_scratch(scratch_root)
        try:
            tree = scratch / "tree"
            build_tree(spec.pristine, spec.pristine, tree, spec.test_paths, spec.deciding)
            write_files(tree, spec.files)
            give(tree, verifier)
            ran = run_suite(spec, tree, scratch, verifier, python)
            _harness_verdicts[key] = deciding.harness_works(ran.stream, spec.deciding)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return _harness_verdicts[key]
