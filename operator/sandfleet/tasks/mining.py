"""The task factory: mutate what a package's tests cover; keep the mutants its tests catch, as tasks.

Mining runs the package's tests on this host, not in gVisor: every mutant is ours (made by
`mutations`, not written by a policy), and a host run takes a second where a sandbox round trip
would add one per mutant. The host runs them with the same interpreter minor version as the image
(`/usr/bin/python3`, Debian's), under an empty environment, with pytest's wheels and the package's
dependencies (`runtime_wheels`) on the path;
`sandfleet task check` then proves each kept task inside gVisor.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ElementTree
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from sandfleet.tasks.catalogue import Bug, Edit, Mutation, Source, Task, suite_pythonpath
from sandfleet.tasks.fetching import TEST_WHEELS, TaskBuildError, pip_download
from sandfleet.tasks.mutations import Mutant, edit_anchor, mutants

COVERAGE_WHEEL = "coverage==7.6.10"
HOST_PYTHON = "/usr/bin/python3"
_SITECUSTOMIZE = "import coverage\ncoverage.process_startup()\n"


class MiningError(RuntimeError):
    """Mining could not start or the clean tree's tests do not pass; the message says which."""


@dataclass(frozen=True)
class SuiteRun:
    """One run of the package's tests: per-test outcomes from JUnit, the exit code, the time."""

    outcomes: dict[str, str]
    exit_code: int | None  # None: timed out
    seconds: float

    @property
    def failing(self) -> set[str]:
        return {name for name, outcome in self.outcomes.items() if outcome in ("failed", "error")}

    @property
    def passing(self) -> set[str]:
        return {name for name, outcome in self.outcomes.items() if outcome == "passed"}


@dataclass(frozen=True)
class MutantVerdict:
    """What one mutant did to the tests."""

    mutant: Mutant
    file: str
    kept: bool
    reason: str  # "kept", "survived", "timed out", "only broke tests the clean tree does not pass"
    fail_to_pass: tuple[str, ...] = ()


@dataclass
class MiningReport:
    """What a mining run tried, kept and took."""

    source_id: str
    source: Source
    tried: int = 0
    kept: list[Task] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)
    baseline_seconds: float = 0.0
    seconds: float = 0.0

    @property
    def yield_(self) -> float:
        return len(self.kept) / self.tried if self.tried else 0.0


def read_junit(text: str) -> dict[str, str]:
    """Per-test outcomes (`classname::name` -> passed|failed|error|skipped) from a JUnit XML report."""
    outcomes: dict[str, str] = {}
    for case in ElementTree.fromstring(text).iter("testcase"):
        name, classname = case.get("name", ""), case.get("classname")
        tags = {child.tag for child in case}
        outcome = next((t for t in ("failure", "error", "skipped") if t in tags), "passed")
        outcomes[f"{classname}::{name}" if classname else name] = {"failure": "failed"}.get(outcome, outcome)
    return outcomes


def source_files(tree: Path) -> Iterator[Path]:
    """The package's own modules: every .py file that is not a test, a conftest or build script."""
    for path in sorted(tree.rglob("*.py")):
        parts = path.relative_to(tree).parts
        name = parts[-1]
        if any(
            p in ("tests", "test", "testing", "docs", "doc", "examples", "benchmarks") for p in parts[:-1]
        ):
            continue
        if name.startswith("test_") or name.endswith("_test.py") or name in ("conftest.py", "setup.py"):
            continue
        if name in ("noxfile.py", "tasks.py", "fabfile.py") or any(p.startswith(".") for p in parts):
            continue
        yield path


def choose(candidates: list[tuple[str, Mutant]], limit: int, seed: int) -> list[tuple[str, Mutant]]:
    """Up to `limit` mutants, spread over files, operators and lines: one per line per round, seeded."""
    rng = random.Random(seed)
    by_key: dict[tuple[str, str], list[tuple[str, Mutant]]] = {}
    for item in candidates:
        by_key.setdefault((item[0], item[1].operator), []).append(item)
    for group in by_key.values():
        rng.shuffle(group)
    keys = sorted(by_key)
    rng.shuffle(keys)
    chosen: list[tuple[str, Mutant]] = []
    lines: set[tuple[str, int]] = set()
    while len(chosen) < limit and any(by_key.values()):
        progressed = False
        for key in keys:
            group = by_key[key]
            index = next((i for i, (f, m) in enumerate(group) if (f, m.line) not in lines), None)
            if index is None:
                continue
            file, mutant = group.pop(index)
            lines.add((file, mutant.line))
            chosen.append((file, mutant))
            progressed = True
            if len(chosen) >= limit:
                break
        if not progressed:
            lines.clear()  # every line with mutants left was used once: allow one more each
    return chosen


def judge(mutant: Mutant, file: str, run: SuiteRun, passing: set[str]) -> MutantVerdict:
    """Keep a mutant when tests the clean tree passes fail with it (and it ran to the end)."""
    if run.exit_code is None:
        return MutantVerdict(mutant, file, False, "timed out")
    broken = run.failing & passing
    missing = passing - set(run.outcomes)
    if run.exit_code != 0 and not run.outcomes:
        broken = set(passing)  # collection crashed before any report: every test is lost
    if not broken and not missing:
        return MutantVerdict(mutant, file, False, "survived")
    if not broken:
        return MutantVerdict(mutant, file, False, "only made tests vanish")
    return MutantVerdict(mutant, file, True, "kept", tuple(sorted(broken)))


def task_id(source_id: str, operator: str, number: int) -> str:
    return f"{source_id}-{operator.replace('_', '-')}-{number:03d}"


def candidates_for(original: str, verdict: MutantVerdict, siblings: list[Mutant], seed: int) -> list[str]:
    """Replacements an RL policy may choose for the bug's window: the original, the bug, other mutants.

    A sibling counts when it changes nothing outside the bug's window; its text there is the option.
    """
    find, broken = edit_anchor(original, verdict.mutant.source)
    start = original.index(find)
    tail = len(original) - start - len(find)
    options = {broken}
    for other in siblings:
        if len(options) >= 4:
            break
        text = other.source
        if text[:start] == original[:start] and text[len(text) - tail :] == original[len(original) - tail :]:
            option = text[start : len(text) - tail]
            if option != find:
                options.add(option)
    # The policy edits the broken tree, so `find` (the original text) is one of the options.
    result = sorted(options | {find})
    random.Random(seed).shuffle(result)
    return result


class Miner:
    """Runs a tree's tests with and without mutants on this host, and turns the caught ones into tasks."""

    def __init__(
        self,
        tree: Path,
        deps: Path,
        source_id: str,
        source: Source,
        python: str = HOST_PYTHON,
        progress: Callable[[str], None] = print,
        requires: Path | None = None,
    ) -> None:
        self.tree, self.deps, self.source_id, self.source = tree, deps, source_id, source
        self.python, self.progress, self.requires = python, progress, requires

    @property
    def _pythonpath(self) -> str:
        return suite_pythonpath(str(self.deps), str(self.requires) if self.requires else None)

    def _env(self, tree: Path, junit: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {
            "PATH": f"{Path(self.python).parent}:/usr/bin:/bin",
            "HOME": str(tree),
            "LANG": "C.UTF-8",
            "PYTHONPATH": self._pythonpath,
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTEST_ADDOPTS": f"--junitxml={junit} -p no:cacheprovider",
            **(extra or {}),
        }

    def run_tests(self, tree: Path, timeout: float, extra: dict[str, str] | None = None) -> SuiteRun:
        """The package's test command in `tree`, with a JUnit report, in a clean environment."""
        with tempfile.TemporaryDirectory(prefix="sandfleet-mine-") as scratch:
            junit = Path(scratch) / "junit.xml"
            started = time.monotonic()
            suite = subprocess.Popen(
                self.source.test_command,
                shell=True,
                cwd=tree,
                env=self._env(tree, junit, extra),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                code: int | None = suite.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                # The whole session: a timed-out mutant's pytest is the shell's child, and killing
                # only the shell (what subprocess.run does) left it looping forever.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(suite.pid, signal.SIGKILL)
                suite.wait()
            seconds = time.monotonic() - started
            outcomes = read_junit(junit.read_text()) if junit.is_file() and code is not None else {}
        return SuiteRun(outcomes, code, seconds)

    def covered_lines(self, timeout: float) -> dict[str, frozenset[int]]:
        """Lines of the package's own modules the tests execute (coverage.py via sitecustomize)."""
        with tempfile.TemporaryDirectory(prefix="sandfleet-cov-") as scratch:
            hook = Path(scratch) / "hook"
            hook.mkdir()
            (hook / "sitecustomize.py").write_text(_SITECUSTOMIZE)
            rc = Path(scratch) / "coveragerc"
            data = Path(scratch) / "coverage.data"
            rc.write_text(f"[run]\ndata_file = {data}\nsource = {self.tree}\n")
            extra = {
                "COVERAGE_PROCESS_START": str(rc),
                "PYTHONPATH": f"{hook}:{self._pythonpath}",
            }
            run = self.run_tests(self.tree, timeout, extra)
            if run.exit_code != 0:
                raise MiningError(f"the tests fail under coverage (exit {run.exit_code})")
            report = Path(scratch) / "coverage.json"
            subprocess.run(
                [self.python, "-m", "coverage", "json", f"--data-file={data}", "-o", str(report), "-q"],
                env={**self._env(self.tree, report), "PYTHONPATH": str(self.deps)},
                cwd=self.tree,
                check=True,
                capture_output=True,
                timeout=timeout,
            )
            files = json.loads(report.read_text())["files"]
        covered: dict[str, frozenset[int]] = {}
        for name, info in files.items():
            path = Path(name) if Path(name).is_absolute() else self.tree / name
            covered[path.resolve().relative_to(self.tree.resolve()).as_posix()] = frozenset(
                info["executed_lines"]
            )
        return covered

    def mine(self, limit: int, seed: int, jobs: int = 1) -> MiningReport:
        """Baseline, coverage, then each chosen mutant in its own copy of the tree; the kept ones as tasks."""
        started = time.monotonic()
        report = MiningReport(self.source_id, self.source)
        baseline = self.run_tests(self.tree, self.source.timeouts.test_s)
        if baseline.exit_code != 0 or baseline.failing or not baseline.passing:
            raise MiningError(
                f"the clean tree's tests do not pass (exit {baseline.exit_code}, "
                f"{len(baseline.failing)} failing, {len(baseline.passing)} passing); "
                "fix the test command or pick another version"
            )
        passing = baseline.passing
        report.baseline_seconds = baseline.seconds
        self.progress(f"baseline: {len(passing)} tests pass in {baseline.seconds:.1f} s; measuring coverage")
        covered = self.covered_lines(self.source.timeouts.test_s * 3)
        pool: list[tuple[str, Mutant]] = []
        all_mutants: dict[str, list[Mutant]] = {}
        originals: dict[str, str] = {}
        for path in source_files(self.tree):
            relative = path.relative_to(self.tree).as_posix()
            lines = covered.get(relative)
            if not lines:
                continue
            originals[relative] = path.read_text()
            found = list(mutants(originals[relative], lines))
            all_mutants[relative] = found
            pool.extend((relative, m) for m in found)
        chosen = choose(pool, limit, seed)
        self.progress(
            f"{len(pool)} mutants of covered lines in {len(all_mutants)} modules; trying {len(chosen)}"
        )
        timeout = min(self.source.timeouts.test_s, baseline.seconds * 5 + 10)
        verdicts = self._run_all(chosen, passing, timeout, jobs, report)
        kept_by_operator: dict[str, int] = {}
        for verdict in verdicts:
            if not verdict.kept:
                continue
            number = kept_by_operator.get(verdict.mutant.operator, 0) + 1
            kept_by_operator[verdict.mutant.operator] = number
            original = originals[verdict.file]
            find, replace = edit_anchor(original, verdict.mutant.source)
            siblings = [
                m
                for m in all_mutants[verdict.file]
                if m.line == verdict.mutant.line and m.source != verdict.mutant.source
            ]
            report.kept.append(
                Task(
                    id=task_id(self.source_id, verdict.mutant.operator, number),
                    source=self.source_id,
                    bug=Bug(
                        edit=Edit(file=verdict.file, find=find, replace=replace),
                        mutation=Mutation(
                            operator=verdict.mutant.operator,
                            line=verdict.mutant.line,
                            description=verdict.mutant.description,
                        ),
                    ),
                    fail_to_pass=list(verdict.fail_to_pass),
                    candidates=candidates_for(original, verdict, siblings, seed + number),
                )
            )
        report.source = self.source.model_copy(update={"tests_passing": sorted(passing)})
        report.seconds = time.monotonic() - started
        return report

    def _run_all(
        self,
        chosen: list[tuple[str, Mutant]],
        passing: set[str],
        timeout: float,
        jobs: int,
        report: MiningReport,
    ) -> list[MutantVerdict]:
        with tempfile.TemporaryDirectory(prefix="sandfleet-mutants-") as scratch:
            trees = []
            for worker in range(jobs):
                copy = Path(scratch) / f"tree-{worker}"
                shutil.copytree(self.tree, copy, symlinks=True)
                trees.append(copy)
            free = list(trees)
            verdicts: list[MutantVerdict] = []

            def attempt(item: tuple[str, Mutant]) -> MutantVerdict:
                tree = free.pop()
                target = tree / item[0]
                original = target.read_text()
                try:
                    target.write_text(item[1].source)
                    run = self.run_tests(tree, timeout)
                finally:
                    target.write_text(original)
                    free.append(tree)
                return judge(item[1], item[0], run, passing)

            with ThreadPoolExecutor(max_workers=jobs) as executor:
                for index, verdict in enumerate(executor.map(attempt, chosen), start=1):
                    verdicts.append(verdict)
                    report.tried = index
                    report.reasons[verdict.reason] = report.reasons.get(verdict.reason, 0) + 1
                    kept = sum(1 for v in verdicts if v.kept)
                    detail = f"{len(verdict.fail_to_pass)} tests fail" if verdict.kept else verdict.reason
                    self.progress(
                        f"mutant {index}/{len(chosen)} {verdict.file}:{verdict.mutant.line} "
                        f"{verdict.mutant.operator}: {detail}; kept {kept}"
                    )
        return verdicts


def fetch_sdist(requirement: str, downloads: Path) -> Path:
    """The pinned sdist from PyPI (cached), by `pip download --no-binary :all: --no-deps`."""
    name, version = requirement.split("==")
    pattern = f"{name.replace('-', '[-_]')}-{version}.tar.gz"
    found = sorted(downloads.glob(pattern)) or sorted(downloads.glob(f"{name}-{version}.tar.gz"))
    if not found:
        pip_download(["--no-binary", ":all:", requirement], downloads)
        found = [
            p for p in downloads.glob("*.tar.gz") if p.name.lower().startswith(name.lower().replace("-", "_"))
        ]
        found = found or [p for p in downloads.glob("*.tar.gz") if p.name.lower().startswith(name.lower())]
        found = [p for p in found if version in p.name]
    if not found:
        raise MiningError(f"pip downloaded no sdist for {requirement}")
    return found[0]


def runtime_wheels(requirement: str, downloads: Path) -> list[Path]:
    """The wheels `requirement` needs at run time (its dependencies, not itself), fetched and cached.

    A task's tests import its package's dependencies (isodate needs six). pip resolves them once
    (`install --dry-run --report`); the pins are kept next to the sdist, so a rebuild is offline.
    """
    name, version = requirement.split("==")
    pins_file = downloads / f"{_canonical(name)}-{version}.requires.txt"
    if not pins_file.is_file():
        downloads.mkdir(parents=True, exist_ok=True)
        report = downloads / f".{pins_file.name}.{os.getpid()}.json"
        argv = [sys.executable, "-m", "pip", "install",
                "--dry-run", "--quiet", "--ignore-installed", "--prefer-binary", "--report",
                str(report), requirement]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, env=_pip_env())
        if done.returncode != 0:
            detail = done.stderr.strip()[-800:]
            raise TaskBuildError(f"resolving {requirement}'s dependencies failed: {detail}")
        installs = json.loads(report.read_text())["install"]
        report.unlink()
        pins = sorted(
            f"{item['metadata']['name']}=={item['metadata']['version']}"
            for item in installs
            if _canonical(item["metadata"]["name"]) != _canonical(name)
        )
        pins_file.write_text("".join(f"{pin}\n" for pin in pins))
    pins = pins_file.read_text().split()
    missing = [pin for pin in pins if _wheel(downloads, pin) is None]
    if missing:
        pip_download(["--only-binary", ":all:", *missing], downloads)
    wheels = [_wheel(downloads, pin) for pin in pins]
    absent = [pin for pin, wheel in zip(pins, wheels, strict=True) if wheel is None]
    if absent:
        raise TaskBuildError(f"{requirement}: no wheel for its dependencies {', '.join(absent)}")
    return [wheel for wheel in wheels if wheel is not None]


def unpack_wheels(wheels: list[Path], target: Path) -> Path:
    """The wheels unpacked into `target` (one directory on PYTHONPATH), unless already there."""
    if not target.is_dir():
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(partial)
        partial.rename(target)
    return target


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel(downloads: Path, pin: str) -> Path | None:
    name, version = pin.split("==")
    for wheel in sorted(downloads.glob("*.whl")):
        wheel_name, wheel_version = wheel.name.split("-")[:2]
        if _canonical(wheel_name) == _canonical(name) and wheel_version == version:
            return wheel
    return None


def _pip_env() -> dict[str, str]:
    # None of the host's pip settings (PIP_*, a user config) may change what a task resolves to.
    return {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "PIP_CONFIG_FILE": os.devnull,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "LANG": "C.UTF-8"}  # fmt: skip


def unpack(sdist: Path, dest: Path) -> Path:
    """The sdist's tree under `dest`, without shipped bytecode; its top directory."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with tarfile.open(sdist) as archive:
        archive.extractall(dest, filter="data")
    tops = [p for p in dest.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise MiningError(f"{sdist.name} does not hold one top directory")
    for cache in list(tops[0].rglob("__pycache__")):
        shutil.rmtree(cache, ignore_errors=True)
    return tops[0]


def test_deps(downloads: Path, dest: Path, with_coverage: bool) -> Path:
    """Pytest's wheels (and coverage's, for mining) unpacked into one directory on PYTHONPATH."""
    wanted = [*TEST_WHEELS, *([COVERAGE_WHEEL] if with_coverage else [])]
    missing = [w for w in wanted if not any(downloads.glob(f"{w.split('==')[0]}-{w.split('==')[1]}-*.whl"))]
    if missing:
        pip_download(["--only-binary", ":all:", "--python-version", "3.11", *missing], downloads)
    key = hashlib.sha256("\n".join(wanted).encode()).hexdigest()[:12]
    wheels = [wheel for pin in wanted if (wheel := _wheel(downloads, pin)) is not None]
    return unpack_wheels(wheels, dest / f"deps-{key}")
