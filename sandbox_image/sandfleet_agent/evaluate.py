"""Evaluate: apply a patch, run the tests as the verifier, and turn the outcome into a reward and results.

The Harbor convention is honoured: when no command is given, `tests/test.sh` runs, and a reward it
writes to `<logs>/verifier/reward.txt` (or `reward.json`) wins over the exit code. Per-test results
come only from the JUnit XML report the verifier writes into that directory, never from output.
Every report carries a typed `outcome` (passed, failed, timed_out, infra_error): see `outcome_of`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import stat
import subprocess
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping
from dataclasses import dataclass, replace
from http import HTTPStatus
from pathlib import Path

from sandfleet_agent import programs, scoring, wire
from sandfleet_agent.errors import AgentError, bad_request, unprocessable
from sandfleet_agent.params import optional_bool, optional_str
from sandfleet_agent.paths import Workspace
from sandfleet_agent.process import (
    ExecSpec,
    parse_exec_spec,
    render_output,
    run,
    tracked_popen,
    wait_and_forget,
)
from sandfleet_agent.users import Identity, end_processes, is_root

HARBOR_TEST_SCRIPT = "tests/test.sh"
# Where a Harbor trial uploads a task's tests and its reference solution.
HARBOR_TESTS_DIR = "/tests"
HARBOR_SOLUTION_DIR = "/solution"
# Under <logs>, what Harbor's agents write (an oracle's log, the artifacts a separate verifier gets):
# the commands' user's, where <logs> and <logs>/verifier stay root's and the verifier's.
HARBOR_EPISODE_LOG_DIRS = ("agent", "artifacts")
PATCH_TIMEOUT_S = 60.0
OUTPUT_TAIL_BYTES = 64 << 10
DEFAULT_EVALUATE_TIMEOUT_S = 1800.0
DEFAULT_JUNIT_NAME = "junit.xml"
MAX_REWARD_BYTES = 64 << 10
MAX_JUNIT_BYTES = 64 << 20
_NOT_REGULAR = b"\x00"
# Exit statuses a shell gives when the command itself could not be run (not found, not executable).
CANNOT_RUN = {126: "not executable", 127: "not found"}


@dataclass(frozen=True)
class Verification:
    """Where the verifier reports, and the users the episode's code and the verifier run as."""

    logs_dir: Path
    exec_user: Identity | None = None
    verifier_user: Identity | None = None
    commands_ran: bool = False  # a caller's exec or job ran in this sandbox

    @property
    def verifier_dir(self) -> Path:
        """<logs>/verifier: the verifier writes its reward and JUnit report here, nobody else can."""
        return self.logs_dir / "verifier"


def evaluate(
    body: Mapping[str, object], workspace: Workspace, base_env: Mapping[str, str], verification: Verification
) -> dict[str, object]:
    """Apply the patch (if any), run the tests as the verifier, and report reward, tests and timings.

    Before the verifier starts every process of the sandbox user is ended, so nothing the episode
    left running can touch the verifier's directory while it runs; after it, every process of the
    verifier is ended, so nothing rewrites its results before they are read.
    """
    started = time.monotonic()
    if is_root(verification.exec_user):
        if verification.commands_ran:
            # Root's processes can reach this agent (and cannot be told from its own to end them): a
            # verdict from here would be the episode's to write. The gateway scores such an episode
            # in a clean sandbox of the same image (gateway/clean_scoring.py).
            raise AgentError(
                HTTPStatus.CONFLICT,
                wire.SCORE_ELSEWHERE,
                "commands ran as root in this sandbox, so it cannot score its own episode: evaluate "
                "with a task through the gateway, which scores the episode's tree in a clean sandbox",
            )
        # The clean sandbox of another's episode: no command of root's ever ran, none is left to end,
        # and what was uploaded is the episode's tree, as the agent wrote it.
        verification = replace(verification, exec_user=None)
    if body.get("task") is not None:
        return evaluate_task(body, workspace, verification)
    patch = optional_str(body, "patch")
    junit_name = _junit_name(optional_str(body, "junit_xml"))
    verifier = verification.verifier_dir
    spec = _test_spec(body, workspace, base_env, verification, verifier / junit_name)
    patch_report: dict[str, object] = {"applied": False}
    if patch:
        patch_report = apply_patch(patch, spec.cwd, base_env, verification.exec_user)
    patch_done = time.monotonic()

    end_processes(verification.exec_user)
    end_processes(verification.verifier_user)
    _prepare_verifier_dir(verification)
    result = run(spec)
    end_processes(verification.verifier_user)
    tests_done = time.monotonic()

    reward, source, reward_error = read_reward(verifier, result.exit_code)
    report_path = verifier / junit_name
    tests_error = None
    try:
        cases = read_junit(report_path)
    except AgentError as error:
        # The verifier ran the episode's code, which may have spoiled the report: no counts, no 5xx.
        cases, tests_error = [], error.message
    found = _is_regular_file(report_path)
    outcome, reason = outcome_of(
        reward=reward,
        reward_source=source,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        report_required=optional_bool(body, "require_report"),
        report_found=found and tests_error is None,
    )
    report: dict[str, object] = {
        "outcome": outcome,
        "reward": reward,
        "reward_source": source,
        "patch": patch_report,
        "tests": [case.entry() for case in cases],
        "tests_report": str(report_path) if found else None,
        "counts": tally(cases),
        "exec": {
            **result.summary(),
            "argv": spec.argv,
            "stdout_tail": render_output(result.stdout[-OUTPUT_TAIL_BYTES:], "utf-8"),
            "stderr_tail": render_output(result.stderr[-OUTPUT_TAIL_BYTES:], "utf-8"),
        },
        "durations": {
            "patch_s": round(patch_done - started, 6),
            "tests_s": round(tests_done - patch_done, 6),
            "total_s": round(time.monotonic() - started, 6),
        },
    }
    if reason is not None:
        report["outcome_reason"] = reason
    if reward_error is not None:
        report["reward_error"] = reward_error
    if tests_error is not None:
        report["tests_error"] = tests_error
    return report


def evaluate_task(
    body: Mapping[str, object], workspace: Workspace, verification: Verification
) -> dict[str, object]:
    """Score a task by its deciding tests (scoring.py): the patch goes into the episode's tree first.

    The task says how its tests run, so a command, a JUnit name or a report requirement with it is
    a mistake, refused rather than ignored.
    """
    started = time.monotonic()
    mixed = sorted(key for key in ("argv", "shell", "junit_xml", "require_report", "env") if key in body)
    if mixed:
        raise bad_request(
            f"give a 'task' or a test command, not both: the task defines how its tests run ({mixed})",
            "bad_task",
        )
    spec = scoring.parse_task(body["task"], workspace)
    patch = optional_str(body, "patch")
    patch_report: dict[str, object] = {"applied": False}
    if patch:
        patch_report = apply_patch(patch, spec.tree, {"PATH": scoring.SAFE_PATH}, verification.exec_user)
    end_processes(verification.exec_user)
    end_processes(verification.verifier_user)
    report = scoring.score(
        spec, verification.logs_dir / "scoring", verification.verifier_user, verification.exec_user
    )
    durations = report["durations"]
    assert isinstance(durations, dict)
    durations["total_s"] = round(time.monotonic() - started, 6)
    return {**report, "patch": patch_report}


def outcome_of(
    *,
    reward: float,
    reward_source: str,
    exit_code: int | None,
    timed_out: bool,
    report_required: bool,
    report_found: bool,
) -> tuple[str, str | None]:
    """The typed outcome of one evaluation and, unless it passed or failed plainly, why.

    In order: the verifier could not run (its command not found or not executable, and it wrote
    no reward) or a required JUnit report is missing or unreadable: `infra_error`; the tests ran
    past their timeout: `timed_out`; a reward of at least 1: `passed`; anything else: `failed`.
    """
    if reward_source == wire.EXIT_CODE and exit_code in CANNOT_RUN:
        why = f"the test command could not be run (exit {exit_code}: {CANNOT_RUN[exit_code]})"
        return wire.INFRA_ERROR, why
    if report_required and not report_found:
        return wire.INFRA_ERROR, "the verifier wrote no readable JUnit report, and one was required"
    if timed_out:
        return wire.TIMED_OUT, "the tests ran past their timeout and were killed"
    return (wire.PASSED, None) if reward >= 1.0 else (wire.FAILED, None)


def _junit_name(raw: str | None) -> str:
    """The report's file name; it is only ever read from the verifier directory."""
    if raw is None or raw == "":
        return DEFAULT_JUNIT_NAME
    name = os.path.basename(raw)
    if not name or name in {".", ".."} or "\x00" in name:
        raise bad_request(
            f"'junit_xml' must name a file (like {DEFAULT_JUNIT_NAME!r}) the verifier writes "
            "into its directory ($SANDFLEET_VERIFIER_DIR)",
            code="bad_junit",
        )
    return name


def _test_spec(
    body: Mapping[str, object],
    workspace: Workspace,
    base_env: Mapping[str, str],
    verification: Verification,
    junit: Path,
) -> ExecSpec:
    request = dict(body)
    request.pop("patch", None)
    request.pop("junit_xml", None)
    request.pop("require_report", None)
    if request.get("argv") is None and request.get("shell") is None:
        script = workspace.resolve(optional_str(body, "cwd")) / HARBOR_TEST_SCRIPT
        if not script.is_file():
            raise unprocessable(
                f"no test command given and no {HARBOR_TEST_SCRIPT} in the working directory",
                wire.NO_TEST_COMMAND,
            )
        request["argv"] = ["bash", HARBOR_TEST_SCRIPT]
    spec = parse_exec_spec(
        request,
        workspace,
        base_env,
        default_timeout_s=DEFAULT_EVALUATE_TIMEOUT_S,
        user=verification.verifier_user,
    )
    env = dict(spec.env)
    if verification.verifier_user is not None:
        env["HOME"] = verification.verifier_user.home
    env["SANDFLEET_VERIFIER_DIR"] = str(verification.verifier_dir)
    # pytest writes the machine-readable report the counts come from, and no cache into the tree.
    addopts = f"--junitxml={junit} -p no:cacheprovider"
    env["PYTEST_ADDOPTS"] = f"{env.get('PYTEST_ADDOPTS', '')} {addopts}".strip()
    return ExecSpec(
        argv=spec.argv,
        cwd=spec.cwd,
        env=env,
        stdin=spec.stdin,
        timeout_s=spec.timeout_s,
        max_output_bytes=spec.max_output_bytes,
        encoding=spec.encoding,
        user=spec.user,
    )


def apply_patch(
    patch: str, cwd: Path, base_env: Mapping[str, str], user: Identity | None = None
) -> dict[str, object]:
    """Apply a unified diff with `git apply` (which also works outside a git repository), as `user`.

    The patch is checked first so a bad one leaves the tree untouched and is reported with git's
    own explanation.
    """
    if not patch.endswith("\n"):
        patch += "\n"
    check = _git_apply(["--check", "--numstat"], patch, cwd, base_env, user)
    if check.returncode != 0:
        raise unprocessable(
            f"the patch does not apply: {check.stderr.decode(errors='replace').strip()}", wire.BAD_PATCH
        )
    files = [line.split("\t", 2)[2] for line in check.stdout.decode().splitlines() if line.count("\t") >= 2]
    applied = _git_apply([], patch, cwd, base_env, user)
    if applied.returncode != 0:
        raise unprocessable(
            f"the patch failed to apply: {applied.stderr.decode(errors='replace').strip()}", wire.BAD_PATCH
        )
    return {"applied": True, "files": files}


def _git_apply(
    flags: list[str], patch: str, cwd: Path, base_env: Mapping[str, str], user: Identity | None
) -> subprocess.CompletedProcess[bytes]:
    argv = [*programs.git(), "apply", "--whitespace=nowarn", *flags, "-"]
    try:
        # Root never runs git in a tree the episode controls: its config can name programs to run.
        identity = {} if user is None else {"user": user.uid, "group": user.gid, "extra_groups": []}
        proc = tracked_popen(
            argv,
            cwd=cwd,
            env=programs.own_program_env(base_env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            **identity,
        )
    except FileNotFoundError:
        raise unprocessable("git is not installed in this sandbox", wire.COMMAND_NOT_FOUND) from None
    try:
        stdout, stderr = proc.communicate(patch.encode(), timeout=PATCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        wait_and_forget(proc)
        raise unprocessable("applying the patch timed out", wire.BAD_PATCH) from None
    return subprocess.CompletedProcess(argv, wait_and_forget(proc), stdout, stderr)


def prepare_episode_logs(logs: Path, exec_user: Identity) -> None:
    """Make <logs> (root's) and Harbor's episode directories in it, the commands' user's.

    A Harbor trial makes /logs/agent writable before its agent runs (the oracle writes its log
    there); the verifier's directory is left to evaluate, which empties and re-owns it each time.
    """
    if logs.is_symlink():
        logs.unlink()
    logs.mkdir(parents=True, exist_ok=True)
    os.lchown(logs, os.geteuid(), os.getegid())
    os.chmod(logs, 0o755)
    for name in HARBOR_EPISODE_LOG_DIRS:
        directory = logs / name
        if directory.is_symlink() or (directory.exists() and not directory.is_dir()):
            directory.unlink()
        directory.mkdir(mode=0o755, exist_ok=True)
        os.lchown(directory, exec_user.uid, exec_user.gid)


def _prepare_verifier_dir(verification: Verification) -> None:
    """Empty the verifier directory and give it to the verifier: the sandbox user cannot write there.

    With users split, <logs> is made the agent's and not writable by others, so the directory
    cannot be swapped for a link either.
    """
    logs, verifier, owner = verification.logs_dir, verification.verifier_dir, verification.verifier_user
    try:
        if owner is not None and logs.is_symlink():
            logs.unlink()
        logs.mkdir(parents=True, exist_ok=True)
        if owner is not None:
            os.lchown(logs, os.geteuid(), os.getegid())
            os.chmod(logs, 0o755)
        if verifier.is_symlink() or (verifier.exists() and not verifier.is_dir()):
            verifier.unlink()
        elif verifier.exists():
            shutil.rmtree(verifier)
        verifier.mkdir(mode=0o755)
        if owner is not None:
            os.chown(verifier, owner.uid, owner.gid)
    except OSError as error:
        raise AgentError(
            HTTPStatus.UNPROCESSABLE_ENTITY,
            wire.VERIFIER_DIR_UNWRITABLE,
            f"cannot prepare {str(verifier)!r}: {error.strerror}",
        ) from None


def _is_regular_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _read_report_file(path: Path, limit: int) -> bytes | None:
    """A regular file's first `limit`+1 bytes, None if absent; never through a link the verifier planted."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:
        return _NOT_REGULAR
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return _NOT_REGULAR
        return handle.read(limit + 1)


def read_reward(verifier: Path, exit_code: int | None) -> tuple[float, str, str | None]:
    """Return (reward, where it came from, a problem with the reward file if any).

    A reward file wins; without one, the exit code decides: 0 is 1.0, anything else 0.0.
    """
    fallback = 1.0 if exit_code == 0 else 0.0
    text = _read_report_file(verifier / "reward.txt", MAX_REWARD_BYTES)
    if text is not None:
        if text == _NOT_REGULAR:
            return 0.0, wire.REWARD_FILE, "reward.txt is not a regular file"
        raw = text.decode(errors="replace").strip()
        try:
            value = float(raw)
        except ValueError:
            return 0.0, wire.REWARD_FILE, f"reward.txt does not hold a number: {raw[:80]!r}"
        if not math.isfinite(value):
            return 0.0, wire.REWARD_FILE, f"reward.txt holds {raw[:80]!r}"
        return value, wire.REWARD_FILE, None
    data = _read_report_file(verifier / "reward.json", MAX_REWARD_BYTES)
    if data is not None:
        try:
            parsed = json.loads(data)
        except ValueError:
            return 0.0, wire.REWARD_FILE, "reward.json is not valid JSON"
        value_or_none = _reward_from_json(parsed)
        if value_or_none is None:
            return 0.0, wire.REWARD_FILE, "reward.json has no numeric 'reward'"
        return value_or_none, wire.REWARD_FILE, None
    return fallback, wire.EXIT_CODE, None


def _reward_from_json(data: object) -> float | None:
    if isinstance(data, bool):
        return None
    if isinstance(data, int | float):
        return float(data)
    if isinstance(data, dict):
        reward = data.get("reward")
        if isinstance(reward, int | float) and not isinstance(reward, bool):
            return float(reward)
    return None


@dataclass(frozen=True)
class JunitCase:
    """One <testcase> of a JUnit report and the results inside it (subtests add one per failure)."""

    name: str
    duration_s: float | None = None
    failures: int = 0
    errors: int = 0
    skipped: int = 0
    xfailed: int = 0
    # An error raised only in teardown: the test's own call passed (pytest counts both).
    teardown_only: bool = False

    @property
    def outcome(self) -> str:
        """The case's one outcome: a failure beats an error beats a skip."""
        if self.failures:
            return "failed"
        if self.errors:
            return "error"
        if self.xfailed:
            return "xfailed"
        if self.skipped:
            return "skipped"
        return "passed"

    def entry(self) -> dict[str, object]:
        """The case as the evaluate response lists it."""
        entry: dict[str, object] = {"name": self.name, "outcome": self.outcome}
        if self.failures > 1:
            entry["failures"] = self.failures
        if self.duration_s is not None:
            entry["duration_s"] = self.duration_s
        return entry


def tally(cases: list[JunitCase]) -> dict[str, int]:
    """Counts as pytest's own summary line gives them (`3 failed, 5 passed, 1 skipped, 1 xfailed`).

    Every <failure> and <error> counts once (a test failing in its call and erroring in teardown
    is one of each; each failed subtest is one failure); a case with no result passed; a case whose
    only result is a teardown error is also one passed, as pytest counts it. A non-strict XPASS
    is indistinguishable from a pass in JUnit and counts as passed.
    """
    counts = dict.fromkeys(wire.COUNT_KEYS, 0)
    seen: set[str] = set()
    for case in cases:
        counts["failed"] += case.failures
        counts["error"] += case.errors
        counts["skipped"] += case.skipped
        counts["xfailed"] += case.xfailed
        results = case.failures + case.errors + case.skipped + case.xfailed
        if results == 0 or (case.teardown_only and case.name not in seen):
            counts["passed"] += 1
        seen.add(case.name)
    return counts


def read_junit(path: Path) -> list[JunitCase]:
    """The test cases of a JUnit XML report (pytest --junitxml, most other runners); [] if none."""
    raw = _read_report_file(path, MAX_JUNIT_BYTES)
    if raw is None:
        return []
    if raw == _NOT_REGULAR or len(raw) > MAX_JUNIT_BYTES:
        raise unprocessable(
            f"the JUnit report {str(path)!r} is not a regular file under {MAX_JUNIT_BYTES} bytes", "bad_junit"
        )
    try:
        root = ElementTree.fromstring(raw)
    except ElementTree.ParseError as error:
        raise unprocessable(f"the JUnit report is not valid XML: {error}", "bad_junit") from None
    return [_case(element) for element in root.iter("testcase")]


def _case(element: ElementTree.Element) -> JunitCase:
    name, classname = element.get("name", ""), element.get("classname")
    tags = [child for child in element if child.tag in {"failure", "error", "skipped"}]
    errors = [child for child in tags if child.tag == "error"]
    xfailed = sum(1 for c in tags if c.tag == "skipped" and c.get("type") == "pytest.xfail")
    duration = None
    with contextlib.suppress(TypeError, ValueError):
        duration = float(element.get("time") or "")
    return JunitCase(
        name=f"{classname}::{name}" if classname else name,
        duration_s=duration,
        failures=sum(1 for child in tags if child.tag == "failure"),
        errors=len(errors),
        skipped=sum(1 for child in tags if child.tag == "skipped") - xfailed,
        xfailed=xfailed,
        teardown_only=bool(errors)
        and len(errors) == len(tags)
        and all((e.get("message") or "").startswith("failed on teardown") for e in errors),
    )


def parse_junit(path: Path) -> list[dict[str, object]]:
    """Per-test outcomes from a JUnit XML report, as the evaluate response lists them; [] if none."""
    return [case.entry() for case in read_junit(path)]


def default_logs_dir() -> Path:
    """Where the Harbor convention puts logs: /logs, unless the agent is told otherwise."""
    return Path(os.environ.get("SANDFLEET_LOGS_DIR", "/logs"))
