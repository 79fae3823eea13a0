"""The RL loop as the chart runs it: a learner process and actor processes, on real gVisor sandboxes.

Also `sandfleet rl run` (the demo's one-process path) through the CLI, with its summary and plots.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandfleet.client import Fleet
from sandfleet.rl.catalogue_tasks import load_tasks
from tests.e2e.local.test_rl_loop import tasks_gateway
from tests.support.kube import wait_until
from tests.support.servers import free_port, wait_until_ready

pytestmark = pytest.mark.gvisor
__all__ = ["tasks_gateway"]  # the module's fixture: `sandfleet serve --local --tasks`, pool "tasks"


def start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "sandfleet.cli", "rl", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def last_summary(log: Path, prefix: str) -> dict[str, Any]:
    lines = [line for line in log.read_text().splitlines() if line.startswith(prefix)]
    assert lines, log.read_text()[-3000:]
    summary: dict[str, Any] = json.loads(lines[-1].removeprefix(prefix))
    return summary


def test_a_learner_and_two_actor_processes_train_through_the_gateway(
    tasks_gateway: str, tmp_path: Path
) -> None:
    run = "processes"
    port = free_port()
    learner_url = f"http://127.0.0.1:{port}"
    # The chart's configuration: environment variables, not flags.
    env = dict(os.environ, SANDFLEET_GATEWAY_URL=tasks_gateway, SANDFLEET_LEARNER_URL=learner_url,
               SANDFLEET_RUN=run, SANDFLEET_POOL="tasks")  # fmt: skip
    env.pop("SANDFLEET_URL", None)
    learner_log = tmp_path / "learner.log"
    learner = start(["learner", "--port", str(port), "--batch-size", "2"], learner_log, env)
    actors: list[subprocess.Popen[bytes]] = []
    try:
        wait_until_ready(learner_url, learner, learner_log, timeout=30, what="the learner's endpoint")
        for i in range(2):
            # actor-1 has no grace: SIGTERM cancels its episode, and it must still release the lease.
            grace = "30" if i == 0 else "0"
            args = ["actor", "--name", f"actor-{i}", "--think", "0.05", "--grace", grace]
            actors.append(start(args, tmp_path / f"actor-{i}.log", env))

        def trained() -> bool:
            for process in [learner, *actors]:
                assert process.poll() is None, "a process exited early"
            stats = httpx.get(f"{learner_url}/v1/stats", timeout=5).json()
            return bool(stats["version"] >= 2 and len(stats["by_actor"]) == 2)

        wait_until(trained, timeout=60, what="both actors' episodes to reach the learner, twice")
        for process in actors:
            process.send_signal(signal.SIGTERM)
        for i, process in enumerate(actors):
            log = tmp_path / f"actor-{i}.log"
            assert process.wait(timeout=45) == 0, log.read_text()[-3000:]
            actor = last_summary(log, "actor stats: ")
            assert actor["episodes"] >= 1
            assert actor["errors"] == 0, actor["last_error"]
            assert 0.0 <= actor["mean_reward_last_20"] <= 1.0
        with Fleet(tasks_gateway) as fleet:
            assert fleet.leases(run=run) == [], "a stopped actor left its lease behind"
        learner.send_signal(signal.SIGTERM)
        assert learner.wait(timeout=30) == 0, learner_log.read_text()[-3000:]
    finally:
        for process in [*actors, learner]:
            if process.poll() is None:
                process.kill()
                process.wait()
    final = last_summary(learner_log, "learner stats: ")
    assert final["received"] >= 4
    assert set(final["by_actor"]) == {"actor-0", "actor-1"}
    assert 0.0 <= final["mean_reward"] <= 1.0
    assert final["queued"] == 0  # drained before it exited
    with Fleet(tasks_gateway) as fleet:
        assert fleet.policy(run)["version"] == final["version"] >= 2  # the last version was published
        profile = fleet.profile(run, window_seconds=300)
    phases = {p["phase"] for p in profile["phases"]}
    assert {"sandbox_wait", "generate", "score", "train", "weight_sync", "claim", "exec"} <= phases


def test_rl_run_prints_the_summary_and_writes_plots(tasks_gateway: str, tmp_path: Path) -> None:
    plots = tmp_path / "plots"
    summary = tmp_path / "summary.json"
    result = subprocess.run(
        [sys.executable, "-m", "sandfleet.cli", "rl", "run", "--run", "cli-run", "--pool", "tasks",
         "--actors", "2", "--duration", "12", "--batch-size", "2", "--think", "0.05",
         "--plots", str(plots), "--summary-json", str(summary)],
        env=dict(os.environ, SANDFLEET_URL=tasks_gateway), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "episodes by 2 actors" in out
    assert "lease latency: p50" in out
    assert "reward curve (mean per slice):" in out
    assert f"P(correct edit): {load_tasks()[0].id}" in out  # the default catalogue's tasks
    assert "verdict" in out
    for plot in ("reward.svg", "profile.svg"):
        assert ET.parse(plots / plot).getroot().tag == "{http://www.w3.org/2000/svg}svg", plot
    data = json.loads(summary.read_text())
    assert data["episodes"] >= 2
    assert data["learner_steps"] >= 1
    assert not data["errors"]
    assert all(0.0 <= r <= 1.0 for r in data["reward_curve"])


def test_a_cold_acquire_reports_its_boot_time(tasks_gateway: str) -> None:
    # Three are warm: take them at once, and the next acquire waits for a sandbox being created.
    with Fleet(tasks_gateway) as fleet:
        try:
            warm = [fleet.acquire("tasks", labels={"run": "boot-check"})[0] for _ in range(3)]
            (cold,) = fleet.acquire("tasks", labels={"run": "boot-check"}, wait_seconds=120)
            assert cold.timings["boot_ms"] > 50, (cold.timings, [w.timings for w in warm])
        finally:
            fleet.release_run("boot-check")
        profile = fleet.profile("boot-check", window_seconds=300)
    boot = {p["phase"]: p for p in profile["phases"]}["boot"]
    assert boot["count"] >= 1
    assert boot["total_seconds"] > 0.05
