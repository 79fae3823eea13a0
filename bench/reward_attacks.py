"""Benchmark: reward attacks and the cost of scoring, the command-scored path against the named-tests rule.

Serves the default catalogue (`sandfleet serve --local --tasks`) and takes its isodate task. For
each attack in tests/support/reward_attacks.py, two fresh sandboxes get the same edit: one is
scored as the loop scored before the named-tests rule (the task's test command through `evaluate`,
`require_report`), one as it scores now (the task's `scoring` object). Then honest episodes (the
fix written, then scored) alternate between the two paths, and the time of each `score` call is
reported as p50/p99 and their ratio, measured in one run.

    .venv/bin/python bench/reward_attacks.py            # every attack, 12 honest episodes a path
    .venv/bin/python bench/reward_attacks.py --short    # 4 attacks, 4 honest episodes a path
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from localbench import REPO, log, percentile, serving_tasks

sys.path.insert(0, str(REPO))

from sandfleet.client import Fleet, Sandbox
from sandfleet.rl.catalogue_tasks import apply_edit, load_tasks
from sandfleet.tasks.catalogue import Task
from tests.support.reward_attacks import ATTACKS, Attack, script

TESTS = "src/isodate/tests/test_duration.py"
SHORT_ATTACKS = (
    "reward file written by the module",
    "early exit: os._exit(0) at import",
    "conftest.py at the tree's root",
    "runner monkeypatched: every report made a pass",
)


def by_command(task: Task) -> dict[str, Any]:
    """How the loop scored a task before the named-tests rule: its command, in the episode's tree."""
    return {"shell": task.workspace_test_command, "cwd": task.tree, "timeout_s": 45, "require_report": True}


def by_task(task: Task) -> dict[str, Any]:
    return {"task": {**task.scoring(), "timeout_s": 45}}


def attacked(fleet: Fleet, task: Task, attack: Attack, body: dict[str, Any]) -> dict[str, Any]:
    with fleet.lease("default") as sandbox:
        broken = sandbox.read_file(task.bug_path).decode()
        fixed = apply_edit(broken, task.broken, task.original)
        deciding = list(cast(list[str], task.scoring()["deciding"]))
        made = sandbox.exec(
            ["python3", "-c", script(attack, task.bug_edit.file, TESTS, fixed, deciding)], cwd=task.tree
        )
        if not made.ok:
            raise SystemExit(f"attack {attack.name!r} failed to apply: {made.stderr}")
        result = sandbox.score(**body)
        return {"outcome": str(result.outcome), "reward": result.reward}


def honest(sandbox: Sandbox, task: Task, body: dict[str, Any]) -> float:
    source = sandbox.read_file(task.bug_path).decode()
    sandbox.write_file(task.bug_path, apply_edit(source, task.broken, task.original))
    started = time.monotonic()
    result = sandbox.score(**body)
    seconds = time.monotonic() - started
    if result.reward != 1.0:
        raise SystemExit(f"the honest fix scored {result.reward}: {result.reason}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--short", action="store_true", help="CI size")
    args = parser.parse_args()
    (task,) = [t for t in load_tasks() if t.id.startswith("isodate-")]
    attacks = [a for a in ATTACKS if not args.short or a.name in SHORT_ATTACKS]
    episodes = 4 if args.short else 12
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="sandfleet-bench-attacks-") as tmp:
        log("attacks", "starting the embedded gateway with the task image (built on first use)")
        with serving_tasks(Path(tmp), 3) as url, Fleet(url, timeout=120) as fleet:
            table: list[dict[str, Any]] = []
            for index, attack in enumerate(attacks, 1):
                before = attacked(fleet, task, attack, by_command(task))
                after = attacked(fleet, task, attack, by_task(task))
                table.append({"attack": attack.name, "before": before, "after": after})
                log("attacks", f"{index}/{len(attacks)} {attack.name}: before {before}, after {after}")
            timings: dict[str, list[float]] = {"command": [], "task": []}
            for episode in range(episodes):
                for path, body in (("command", by_command(task)), ("task", by_task(task))):
                    with fleet.lease("default") as sandbox:
                        timings[path].append(honest(sandbox, task, body))
                log("attacks", f"honest episode {episode + 1}/{episodes} on both paths")
    paid_before = sum(1 for row in table if row["before"]["reward"] > 0)
    paid_after = sum(1 for row in table if row["after"]["reward"] > 0)
    cost = {
        path: {"p50_s": round(percentile(v, 50), 3), "p99_s": round(percentile(v, 99), 3)}
        for path, v in timings.items()
    }
    print(
        json.dumps(
            {
                "task": task.id,
                "attacks": table,
                "attacks_paid_before": paid_before,
                "attacks_paid_after": paid_after,
                "score_seconds": cost,
                "score_p50_ratio_task_over_command": round(
                    cost["task"]["p50_s"] / cost["command"]["p50_s"], 3
                ),
                "episodes_per_path": episodes,
            }
        )
    )


if __name__ == "__main__":
    main()
