"""The RL loop on the embedded default: the default catalogue in gVisor, staleness, a short real run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandfleet.client import AsyncFleet, Fleet, Outcome, PolicyConflict
from sandfleet.local.artifacts import ImageRef
from sandfleet.rl.catalogue_tasks import apply_edit, cache_dir, load_tasks, prepare_workspace
from sandfleet.rl.loop import LoopConfig, run_loop
from tests.support.servers import free_port, stop_local_serve, wait_until_ready

pytestmark = pytest.mark.gvisor
TASKS = load_tasks()  # the default catalogue's (tasks/ci.yaml): what `serve --local --tasks` serves


@pytest.fixture(scope="module")
def tasks_gateway(
    runsc: Path, base_image: ImageRef, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`sandfleet serve --local --tasks`: the default catalogue's image (sdists from PyPI, cached) warm."""
    tmp = tmp_path_factory.mktemp("rl")
    port = free_port()
    log = tmp / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "sandfleet.cli", "serve", "--local", "--tasks", "--port", str(port),
             "--warm", "3", "--pool", "tasks", "--policy-file", str(tmp / "policies.json")],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    wait_until_ready(url, process, log, timeout=600, what="serve --tasks to have a warm sandbox")
    yield url
    stop_local_serve(process, log)  # and none of its sandboxes left


def test_only_the_original_line_passes_each_packages_tests(tmp_path: Path) -> None:
    # On the host (same Python minor as the image): the reward must tell the candidates apart.
    workspace = prepare_workspace(TASKS, root=tmp_path, downloads=cache_dir() / "downloads")
    for task in TASKS:
        directory = workspace / "tasks" / task.id
        target = directory / task.bug_edit.file
        broken = target.read_text()
        passing = []
        for index, candidate in enumerate(task.choices):
            target.write_text(apply_edit(broken, task.broken, candidate))
            command = task.workspace_test_command.replace("/workspace", str(workspace))
            if (
                subprocess.run(
                    command, shell=True, cwd=directory, capture_output=True, check=False
                ).returncode
                == 0
            ):
                passing.append(index)
        assert passing == [task.correct_choice], task.id


def test_each_task_is_broken_and_its_own_tests_reward_the_fix(tasks_gateway: str) -> None:
    with Fleet(tasks_gateway) as fleet:
        for task in TASKS:
            with fleet.lease("tasks", labels={"run": "tasks-check"}) as sandbox:
                path = task.bug_path
                run = {"shell": task.workspace_test_command, "cwd": task.tree,
                       "timeout_s": task.test_timeout_s, "require_report": True}  # fmt: skip
                broken = sandbox.evaluate(**run)
                assert (broken.outcome, broken.reward) == (Outcome.FAILED, 0.0), (task.id, broken["exec"])
                source = sandbox.read_file(path).decode()
                sandbox.write_file(path, apply_edit(source, task.broken, task.original))
                fixed = sandbox.evaluate(**run)
                assert (fixed.outcome, fixed.reward) == (Outcome.PASSED, 1.0), (task.id, fixed["exec"])
                assert fixed.counts["passed"] >= 1


def test_large_files_read_whole_through_the_gateway(tasks_gateway: str) -> None:
    # A body-less GET must reach the agent without a body: forwarded as an empty chunked body, the
    # agent resets the connection and large responses (over 100 kB, a package's data module) are cut off.
    with Fleet(tasks_gateway, retries=0) as fleet, fleet.lease("tasks") as sandbox:
        found = sandbox.exec(["find", "/workspace/tasks", "-type", "f", "-size", "+100k", "-print", "-quit"])
        path = found.stdout.strip()
        assert path, "the task image has no file over 100 kB to read"
        size = int(sandbox.exec(["stat", "-c", "%s", path]).stdout)
        assert size > 100_000
        for _ in range(5):
            assert len(sandbox.read_file(path)) == size


def test_a_stale_acquire_is_refused_by_the_real_gateway(tasks_gateway: str) -> None:
    with Fleet(tasks_gateway) as fleet:
        fleet.publish_policy("stale-check", 10, staleness_bound=2)
        with pytest.raises(PolicyConflict, match="8 versions behind"):
            fleet.acquire("tasks", labels={"run": "stale-check"}, policy_version=2)
        (lease,) = fleet.acquire("tasks", labels={"run": "stale-check"}, policy_version=9)
        assert fleet.release(lease.id)


async def test_a_short_real_run_of_the_loop(tasks_gateway: str) -> None:
    config = LoopConfig(run="ci-loop", pool="tasks", actors=2, duration_seconds=20, batch_size=2,
                        think_seconds=0.05)  # fmt: skip
    async with AsyncFleet(tasks_gateway) as fleet:
        stats, learner = await run_loop(fleet, config)
        assert stats.episodes >= 2, stats.errors
        assert not stats.errors
        assert stats.infra_errors == 0, stats.infra_reasons  # a healthy fleet: nothing to mask
        assert set(stats.rewards) <= {0.0, 1.0}
        assert stats.updates, "the learner never stepped"
        assert (await fleet.policy("ci-loop"))["version"] == learner.policy.version >= 1
        profile = await fleet.profile("ci-loop", window_seconds=120)
        phases = {p["phase"] for p in profile["phases"]}
        assert {"sandbox_wait", "generate", "score", "train", "queue", "claim", "exec", "idle"} <= phases
        assert profile["verdict"]["bottleneck"] != "none"
        assert await fleet.leases(run="ci-loop") == []  # the run released everything it leased


def test_profile_and_policy_commands_read_the_run(tasks_gateway: str, tmp_path: Path) -> None:
    env = dict(os.environ, SANDFLEET_URL=tasks_gateway)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sandfleet.cli", *args],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    published = cli("policy", "cli-run", "--publish", "3", "--bound", "1", "--mode", "refuse")
    assert published.returncode == 0, published.stderr
    assert json.loads(cli("policy", "cli-run").stdout)["version"] == 3
    # The loop test above left its spans under ci-loop; the command shows them and plots them.
    plot = tmp_path / "profile.svg"
    shown = cli("profile", "ci-loop", "--window", "600", "--plot", str(plot), "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["verdict"]["bottleneck"] != "none"
    assert ET.parse(plot).getroot().tag == "{http://www.w3.org/2000/svg}svg"
    table = cli("profile", "ci-loop", "--window", "600")
    assert "verdict" in table.stdout
    unknown = cli("policy", "no-such-run")
    assert unknown.returncode == 1
    assert "no published policy" in unknown.stderr
