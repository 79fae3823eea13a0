"""Evaluate: apply a patch, run the task's tests, and turn the outcome into a reward and per-test results.

The Harbor convention is honoured: when no command is given, `tests/test.sh` runs, and a reward it
writes to `<logs>/verifier/reward.txt` (or `reward.json`) wins over the exit code.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping
from http import HTTPStatus
from pathlib import Path

from sandfleet_agent.errors import AgentError, bad_request, unprocessable
from sandfleet_agent.params import optional_str
from sandfleet_agent.paths import Workspace
from sandfleet_agent.process import (
    ExecSpec,
    parse_exec_spec,
    render_output,
    run,
    tracked_popen,
    wait_and_forget,
)

HARBOR_TEST_SCRIPT = "tests/test.sh"
PATCH_TIMEOUT_S = 60.0
OUTPUT_TAIL_BYTES = 64 << 10
DEFAULT_EVALUATE_TIMEOUT_S = 1800.0

# pytest -rA summary lines ("PASSED tests/x.py::test_a") and verbose lines ("tests/x.py::test_a PASSED").
_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)", re.MULTILINE)
_VERBOSE_LINE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", re.MULTILINE)
_OUTCOMES = {
    "PASSED": "passed",
    "XPASS": "passed",
    "XFAIL": "skipped",
    "FAILED": "failed",
    "ERROR": "error",
    "SKIPPED": "skipped",
}


def evaluate(
    body: Mapping[str, object], workspace: Workspace, base_env: Mapping[str, str], logs_dir: Path
) -> dict[str, object]:
    """Apply the patch (if any), run the tests, and report reward, per-test results and timings."""
    started = time.monotonic()
    patch = optional_str(body, "patch")
    junit = optional_str(body, "junit_xml")
    spec = _test_spec(body, workspace, base_env)
    patch_report: dict[str, object] = {"applied": False}
    if patch:
        patch_report = apply_patch(patch, spec.cwd, base_env)
    patch_done = time.monotonic()

    verifier = logs_dir / "verifier"
    _prepare_verifier_dir(verifier)
    env = dict(spec.env)
    env.setdefault("SANDFLEET_VERIFIER_DIR", str(verifier))
    result = run(_with_env(spec, env))
    tests_done = time.monotonic()

    reward, source, reward_error = read_reward(verifier, result.exit_code)
    tests = _test_results(workspace, junit, bytes(result.stdout))
    counts = {outcome: 0 for outcome in ("passed", "failed", "error", "skipped")}
    for test in tests:
        counts[str(test["outcome"])] += 1
    report: dict[str, object] = {
        "reward": reward,
        "reward_source": source,
        "patch": patch_report,
        "tests": tests,
        "counts": counts,
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
    if reward_error is not None:
        report["reward_error"] = reward_error
    return report


def _test_spec(body: Mapping[str, object], workspace: Workspace, base_env: Mapping[str, str]) -> ExecSpec:
    request = dict(body)
    request.pop("patch", None)
    request.pop("junit_xml", None)
    if request.get("argv") is None and request.get("shell") is None:
        script = workspace.resolve(optional_str(body, "cwd")) / HARBOR_TEST_SCRIPT
        if not script.is_file():
            raise unprocessable(
                f"no test command given and no {HARBOR_TEST_SCRIPT} in the working directory",
                "no_test_command",
            )
        request["argv"] = ["bash", HARBOR_TEST_SCRIPT]
    return parse_exec_spec(request, workspace, base_env, default_timeout_s=DEFAULT_EVALUATE_TIMEOUT_S)


def _with_env(spec: ExecSpec, env: dict[str, str]) -> ExecSpec:
    return ExecSpec(
        argv=spec.argv,
        cwd=spec.cwd,
        env=env,
        stdin=spec.stdin,
        timeout_s=spec.timeout_s,
        max_output_bytes=spec.max_output_bytes,
        encoding=spec.encoding,
    )


def apply_patch(patch: str, cwd: Path, base_env: Mapping[str, str]) -> dict[str, object]:
    """Apply a unified diff with `git apply` (which also works outside a git repository).

    The patch is checked first so a bad one leaves the tree untouched and is reported with git's
    own explanation.
    """
    if not patch.endswith("\n"):
        patch += "\n"
    check = _git_apply(["--check", "--numstat"], patch, cwd, base_env)
    if check.returncode != 0:
        raise unprocessable(
            f"the patch does not apply: {check.stderr.decode(errors='replace').strip()}", "bad_patch"
        )
    files = [line.split("\t", 2)[2] for line in check.stdout.decode().splitlines() if line.count("\t") >= 2]
    applied = _git_apply([], patch, cwd, base_env)
    if applied.returncode != 0:
        raise unprocessable(
            f"the patch failed to apply: {applied.stderr.decode(errors='replace').strip()}", "bad_patch"
        )
    return {"applied": True, "files": files}


def _git_apply(
    flags: list[str], patch: str, cwd: Path, base_env: Mapping[str, str]
) -> subprocess.CompletedProcess[bytes]:
    argv = ["git", "apply", "--whitespace=nowarn", *flags, "-"]
    try:
        proc = tracked_popen(
            argv,
            cwd=cwd,
            env=dict(base_env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except FileNotFoundError:
        raise unprocessable("git is not installed in this sandbox", "command_not_found") from None
    try:
        stdout, stderr = proc.communicate(patch.encode(), timeout=PATCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        wait_and_forget(proc)
        raise unprocessable("applying the patch timed out", "bad_patch") from None
    return subprocess.CompletedProcess(argv, wait_and_forget(proc), stdout, stderr)


def _prepare_verifier_dir(verifier: Path) -> None:
    """Create the verifier directory and clear a stale reward so an old one is never read."""
    try:
        verifier.mkdir(parents=True, exist_ok=True)
        for name in ("reward.txt", "reward.json"):
            (verifier / name).unlink(missing_ok=True)
    except OSError as error:
        raise AgentError(
            HTTPStatus.UNPROCESSABLE_ENTITY,
            "verifier_dir_unwritable",
            f"cannot prepare {str(verifier)!r}: {error.strerror}",
        ) from None


def read_reward(verifier: Path, exit_code: int | None) -> tuple[float, str, str | None]:
    """Return (reward, where it came from, a problem with the reward file if any).

    A reward file wins; without one, the exit code decides: 0 is 1.0, anything else 0.0.
    """
    fallback = 1.0 if exit_code == 0 else 0.0
    text_file = verifier / "reward.txt"
    json_file = verifier / "reward.json"
    if text_file.exists():
        raw = text_file.read_text(errors="replace").strip()
        try:
            value = float(raw)
        except ValueError:
            return 0.0, "reward_file", f"reward.txt does not hold a number: {raw[:80]!r}"
        if not math.isfinite(value):
            return 0.0, "reward_file", f"reward.txt holds {raw!r}"
        return value, "reward_file", None
    if json_file.exists():
        try:
            data = json.loads(json_file.read_text())
        except ValueError:
            return 0.0, "reward_file", "reward.json is not valid JSON"
        value_or_none = _reward_from_json(data)
        if value_or_none is None:
            return 0.0, "reward_file", "reward.json has no numeric 'reward'"
        return value_or_none, "reward_file", None
    return fallback, "exit_code", None


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


def _test_results(workspace: Workspace, junit: str | None, stdout: bytes) -> list[dict[str, object]]:
    if junit is not None:
        path = workspace.resolve(junit)
        if path.is_file():
            return parse_junit(path)
    return parse_pytest_output(stdout.decode(errors="replace"))


def parse_junit(path: Path) -> list[dict[str, object]]:
    """Per-test outcomes from a JUnit XML report (pytest --junitxml, most other runners)."""
    try:
        tree = ElementTree.parse(path)
    except ElementTree.ParseError as error:
        raise bad_request(f"the JUnit report is not valid XML: {error}", code="bad_junit") from None
    results: list[dict[str, object]] = []
    for case in tree.iter("testcase"):
        name = case.get("name", "")
        classname = case.get("classname")
        outcome = "passed"
        for child in case:
            if child.tag in {"failure", "error", "skipped"}:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                break
        entry: dict[str, object] = {
            "name": f"{classname}::{name}" if classname else name,
            "outcome": outcome,
        }
        duration = case.get("time")
        if duration:
            with contextlib.suppress(ValueError):
                entry["duration_s"] = float(duration)
        results.append(entry)
    return results


def parse_pytest_output(text: str) -> list[dict[str, object]]:
    """Per-test outcomes from pytest's verbose or `-rA` summary lines; later lines win."""
    outcomes: dict[str, str] = {}
    for match in _VERBOSE_LINE.finditer(text):
        outcomes[match.group(1)] = _OUTCOMES[match.group(2)]
    for match in _SUMMARY_LINE.finditer(text):
        outcomes[match.group(2)] = _OUTCOMES[match.group(1)]
    return [{"name": name, "outcome": outcome} for name, outcome in outcomes.items()]


def default_logs_dir() -> Path:
    """Where the Harbor convention puts logs: /logs, unless the agent is told otherwise."""
    return Path(os.environ.get("SANDFLEET_LOGS_DIR", "/logs"))
