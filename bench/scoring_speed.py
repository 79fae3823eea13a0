"""Benchmark: where scoring's time goes, each catalogue task's deciding tests on the host and in gVisor.

Serves a task catalogue (`sandfleet serve --local` with its task image) and, for each task, scores
the gold fix twice in the same run, alternating which goes first:

- **gVisor**: a warm sandbox is leased, the fix written, and the task scored as the loop scores it
  (`evaluate` with the task's `scoring` object: the agent builds the scoring tree, then runs the
  verdict runner as the verifier). The agent reports its phases (`prepare_s`: the scoring tree;
  `tests_s`: the runner's process) and each test's own duration.
- **host**: the same runner, the same pytest, the same tree and PYTHONPATH, run by the image's own
  python in the image's own root (its unpacked rootfs, entered with `unshare --root`) on the host's
  kernel: only gVisor is taken away.

Per task, both sides also time `python3 -P -c 'import pytest'` with the task's PYTHONPATH (the
interpreter and pytest start-up), the same ignoring the image's bytecode (start-up as it was before
task images shipped it), and a bare process (`true`). The runner's time splits into
start-up, the tests themselves (pytest's per-test durations) and the rest (collection, reporting,
the runner's own checks); the score call's time adds the tree's preparation and the round trip.
Figures: per-phase medians on each side, and the median and p90 over tasks of gVisor over host.

    .venv/bin/python bench/scoring_speed.py                  # tasks/catalogue.yaml: every task
    .venv/bin/python bench/scoring_speed.py --short          # tasks/ci.yaml (3 tasks), CI size
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, cast

from localbench import REPO, log, percentile, serving_tasks

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "sandbox_image"))

from sandfleet.client import Fleet, Sandbox
from sandfleet.local.artifacts import image_ref_from_json
from sandfleet.local.image import ensure_rootfs
from sandfleet.rl.catalogue_tasks import DEFAULT_CATALOGUE, apply_edit, build_image, image_name, load_tasks
from sandfleet.tasks.catalogue import PRISTINE_WORKSPACE, Task
from sandfleet_agent import deciding, scoring

CATALOGUE = REPO / "tasks" / "catalogue.yaml"
SHORT_CATALOGUE = REPO / "tasks" / "ci.yaml"
RUNNER_NAME = "verdict_runner.py"
# The targets (#40): gVisor over host for the time to score, over the catalogue's tasks.
TARGET_MEDIAN_RATIO = 1.3
TARGET_P90_RATIO = 2.0
IMPORT_PYTEST = "import pytest"
# Start-up as it was before task images shipped bytecode (task_image.byte_compile): Python looks for
# bytecode under a prefix that holds none, and writes none, so it compiles every module it imports.
IGNORE_BYTECODE = {"PYTHONPYCACHEPREFIX": "/nonexistent/sandfleet-bench", "PYTHONDONTWRITEBYTECODE": "1"}
PHASES = (
    "score_s",
    "prepare_s",
    "runner_s",
    "startup_s",
    "startup_uncompiled_s",
    "process_s",
    "tests_s",
    "collect_and_report_s",
)


def timed_run(argv: list[str], env: dict[str, str], stdin: bytes = b"", **kw: Any) -> float:
    started = time.perf_counter()
    subprocess.run(argv, env=env, input=stdin, capture_output=True, check=False, timeout=300, **kw)
    return time.perf_counter() - started


def in_image(rootfs: Path, work: Path, cwd: str, argv: list[str]) -> list[str]:
    """`argv` run by the image's own programs on the host's kernel: gVisor is all that is taken away.

    A private mount namespace binds `work` over the image's /tmp and mounts a /proc (the shared
    rootfs itself is not written), then `unshare --root --wd` enters the image's root at `cwd`.
    The wrapper's own cost is in each figure; the bare-process probe (`true`) shows how much.
    """
    enter = (
        'mount --bind "$0" "$1/tmp" && mount -t proc proc "$1/proc" && root=$1 wd=$2 && shift 2 && '
        'exec unshare --root="$root" --wd="$wd" "$@"'
    )
    private = ["unshare", "--mount", "--propagation", "private"]
    return [*private, "sh", "-c", enter, str(work), str(rootfs), cwd, *argv]


def suite_env(pythonpath: list[str], home: str) -> dict[str, str]:
    """The environment the agent gives the verdict runner (sandfleet_agent/scoring.py run_suite).

    Plus one thing: no bytecode written. The host's side runs as root and would write `__pycache__`
    into the shared rootfs, which every sandbox of the image reads; the verifier in gVisor cannot
    write there either.
    """
    return {
        "PATH": scoring.SAFE_PATH,
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "PYTHONPATH": ":".join(pythonpath),
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def changed_since(root: Path, since: float) -> list[str]:
    """Files under `root` changed after `since` (the host side must leave the shared rootfs as it was)."""
    found = []
    for directory, _, files in os.walk(root):
        for name in files:
            path = Path(directory) / name
            if path.lstat().st_mtime > since:
                found.append(str(path.relative_to(root)))
    return found


def on_host(task: Task, rootfs: Path, fixed: str, work: Path) -> dict[str, float]:
    """The task's deciding tests by the verdict runner in the image's own root, on the host's kernel."""
    spec = task.scoring()
    started = time.perf_counter()
    tree = work / "tree"
    shutil.copytree(rootfs / str(spec["pristine"]).lstrip("/"), tree, symlinks=True)
    (tree / task.bug_edit.file).write_text(fixed)
    for name, text in cast(dict[str, str], spec["files"]).items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
    prepared = time.perf_counter() - started
    (work / "home").mkdir()
    shutil.copy(scoring.RUNNER, work / RUNNER_NAME)
    inside = "/tmp/tree"  # where `work` appears in the image's root (in_image)
    pythonpath = [inside if entry == "." else entry for entry in cast(list[str], spec["pythonpath"])]
    env = suite_env(pythonpath, "/tmp/home")
    nonce = secrets.token_hex(16)
    read_end, write_end = os.pipe()
    collected = bytearray()

    def drain() -> None:
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            while chunk := pipe.read(1 << 16):
                collected.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    pytest_args = cast(list[str], spec["pytest_args"])
    runner = ["python3", "-P", f"/tmp/{RUNNER_NAME}", str(write_end), "--", *pytest_args]
    runner_s = timed_run(
        in_image(rootfs, work, inside, runner), env, (nonce + "\n").encode(), pass_fds=(write_end,)
    )
    os.close(write_end)
    reader.join(30)
    stream = deciding.read_stream(bytes(collected), nonce)
    deciding_tests = cast(list[str], spec["deciding"])
    verdict = deciding.decide(
        stream, deciding_tests, exit_code=stream.exit_status, signal=None, timed_out=False
    )
    if verdict.reward != 1.0 or stream.tampered:
        why = f"{verdict.reason} {stream.tampered}"
        raise SystemExit(f"{task.id}: the gold fix did not pass on the host: {why}")
    probe = ["python3", "-P", "-c", IMPORT_PYTEST]
    startup = timed_run(in_image(rootfs, work, inside, probe), env)
    uncompiled = timed_run(in_image(rootfs, work, inside, probe), {**env, **IGNORE_BYTECODE})
    process = timed_run(in_image(rootfs, work, inside, ["true"]), env)
    row = phases(prepared, runner_s, startup, process, sum(stream.durations.values()))
    row["startup_uncompiled_s"] = uncompiled
    return row


def in_gvisor(sandbox: Sandbox, task: Task, fixed: str) -> dict[str, float]:
    """The task scored as the loop scores it, in a warm gVisor sandbox."""
    spec = task.scoring()
    sandbox.write_file(task.bug_path, fixed)
    started = time.perf_counter()
    result = sandbox.score(task=spec)
    call = time.perf_counter() - started
    if result.reward != 1.0:
        raise SystemExit(f"{task.id}: the gold fix did not pass in gVisor: {result.reason}")
    durations = cast(dict[str, float], result["durations"])
    tests = sum(float(t["duration_s"]) for t in cast(list[dict[str, Any]], result["tests"]))
    pythonpath = [task.tree if e == "." else e for e in cast(list[str], spec["pythonpath"])]
    env = {"PYTHONPATH": ":".join(pythonpath), "PYTHONNOUSERSITE": "1"}
    startup = sandbox.exec(["python3", "-P", "-c", IMPORT_PYTEST], cwd=task.tree, env=env).duration_s
    argv = ["python3", "-P", "-c", IMPORT_PYTEST]
    uncompiled = sandbox.exec(argv, cwd=task.tree, env={**env, **IGNORE_BYTECODE}).duration_s
    process = sandbox.exec(["true"], cwd=task.tree).duration_s
    row = phases(durations["prepare_s"], durations["tests_s"], startup, process, tests)
    row["startup_uncompiled_s"] = uncompiled
    row["score_s"] = call  # the whole call, as the loop waits for it
    row["round_trip_s"] = max(call - durations["prepare_s"] - durations["tests_s"], 0.0)
    return row


def phases(prepare: float, runner: float, startup: float, process: float, tests: float) -> dict[str, float]:
    """One side's phases; the runner's time split into start-up, the tests, and the rest."""
    return {
        "score_s": prepare + runner,
        "prepare_s": prepare,
        "runner_s": runner,
        "startup_s": startup,
        "process_s": process,
        "tests_s": tests,
        "collect_and_report_s": max(runner - startup - tests, 0.0),
    }


def ratio_median(rows: list[dict[str, Any]], phase: str) -> float:
    """The median over tasks of one phase's gVisor time over its host time."""
    ratios = [row["gvisor"][phase] / row["host"][phase] for row in rows if row["host"][phase] > 0]
    return round(percentile(ratios, 50), 3) if ratios else 0.0


def medians(rows: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(percentile([row[key] for row in rows], 50), 4) for key in rows[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--short", action="store_true", help="CI size: tasks/ci.yaml")
    parser.add_argument("--catalogue", type=Path, help="a task catalogue (default: tasks/catalogue.yaml)")
    args = parser.parse_args()
    catalogue = args.catalogue or (SHORT_CATALOGUE if args.short else CATALOGUE)
    tasks = load_tasks(catalogue)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log("scoring", f"{len(tasks)} tasks of {catalogue.name}: building (or finding) their image")
    # Under the name `serve --tasks` gives it, so the server finds this very image in the cache.
    built = build_image(tasks, image_name(DEFAULT_CATALOGUE))
    rootfs = asyncio.run(ensure_rootfs(image_ref_from_json(json.dumps(built))))
    rows: list[dict[str, Any]] = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="sandfleet-bench-scoring-") as tmp:
        env = {**os.environ, "SANDFLEET_TASKS": str(catalogue)}
        with serving_tasks(Path(tmp), 2, env=env) as url, Fleet(url, timeout=300) as fleet:
            for index, task in enumerate(tasks):
                with fleet.lease("default") as sandbox:
                    fixed = apply_edit(sandbox.read_file(task.bug_path).decode(), task.broken, task.original)
                    work = Path(tempfile.mkdtemp(dir=tmp))
                    # Alternate which side goes first, so neither always finds the caches warm.
                    if index % 2:
                        gvisor, host = in_gvisor(sandbox, task, fixed), on_host(task, rootfs, fixed, work)
                    else:
                        host, gvisor = on_host(task, rootfs, fixed, work), in_gvisor(sandbox, task, fixed)
                    shutil.rmtree(work, ignore_errors=True)
                ratio = gvisor["runner_s"] / host["runner_s"]
                rows.append({"task": task.id, "host": host, "gvisor": gvisor, "runner_ratio": ratio})
                log(
                    "scoring",
                    f"{index + 1}/{len(tasks)} {task.id}: runner {host['runner_s']:.2f} s on the host, "
                    f"{gvisor['runner_s']:.2f} s in gVisor ({ratio:.2f}x); "
                    f"score {host['score_s']:.2f} s against {gvisor['score_s']:.2f} s",
                )
    written = changed_since(rootfs / PRISTINE_WORKSPACE.lstrip("/"), started)
    if written:
        raise SystemExit(f"the host side wrote into the image's rootfs ({rootfs}): {written[:5]}; remove it")
    runner_ratios = [row["runner_ratio"] for row in rows]
    call_ratios = [row["gvisor"]["score_s"] / row["host"]["score_s"] for row in rows]
    phase_ratios = {phase: ratio_median(rows, phase) for phase in PHASES}
    host_medians = medians([row["host"] for row in rows])
    gvisor_medians = medians([row["gvisor"] for row in rows])
    share = {
        phase: round(gvisor_medians[phase] / gvisor_medians["score_s"], 3)
        for phase in ("prepare_s", "startup_s", "tests_s", "collect_and_report_s", "round_trip_s")
    }
    median_ratio, p90_ratio = percentile(call_ratios, 50), percentile(call_ratios, 90)
    flat = {f"host_{key.removesuffix('_s')}_p50_s": value for key, value in host_medians.items()}
    flat |= {f"gvisor_{key.removesuffix('_s')}_p50_s": value for key, value in gvisor_medians.items()}
    print(
        json.dumps(
            {
                "benchmark": "scoring_speed",
                "catalogue": catalogue.name,
                "tasks": len(rows),
                **flat,
                "score_ratio_p50": round(median_ratio, 3),
                "score_ratio_p90": round(p90_ratio, 3),
                "runner_ratio_p50": round(percentile(runner_ratios, 50), 3),
                "runner_ratio_p90": round(percentile(runner_ratios, 90), 3),
                "target_score_ratio_p50": TARGET_MEDIAN_RATIO,
                "target_score_ratio_p90": TARGET_P90_RATIO,
                "meets_targets": median_ratio <= TARGET_MEDIAN_RATIO and p90_ratio <= TARGET_P90_RATIO,
                "gvisor_share_of_score": share,
                "gvisor_over_host_p50_by_phase": phase_ratios,
                "rows": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
