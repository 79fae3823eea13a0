"""Reward attacks on a real catalogue task in real gVisor: every one scores 0, the honest fix 1.

The task is the default catalogue's isodate task, served by `sandfleet serve --local --tasks` and
scored as the reference loop scores it (the task's `scoring`: its deciding tests, run from the
image's own copy with the episode's source edits carried over). Each attack runs in a fresh
sandbox as the episode's own command (the sandbox user), with the bug left in place
(tests/support/reward_attacks.py). Then one attack on each other scoring path: the gateway's HTTP
API, the CLI's `evaluate --task`, and the gym, SkyRL and verl adapters (built by their real
packages), each configured with the task's `scoring()` as its evaluate body; `task check` sends
the same object (tests/unit/tasks/test_scoring_paths.py).
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import httpx
import pytest
import skyrl_gym
import yaml
from omegaconf import OmegaConf

from sandfleet.adapters.gym import SandboxEnv
from sandfleet.adapters.skyrl import ENV_ID, SandfleetTextEnv, register
from sandfleet.client import Fleet, Outcome, Sandbox
from sandfleet.local.artifacts import ImageRef
from sandfleet.rl.catalogue_tasks import apply_edit, load_tasks
from sandfleet.tasks.catalogue import Task
from tests.support.reward_attacks import ATTACKS, PASSING_CONFTEST, Attack, script
from tests.support.servers import start_local_serve, stop_local_serve
from tests.support.verl_without_gpu import install

install()

from verl.tools.tool_registry import initialize_tools_from_config  # noqa: E402

from sandfleet.adapters.verl import SandboxTool  # noqa: E402

pytestmark = pytest.mark.gvisor

TOKEN = "local-token"
(TASK,) = [task for task in load_tasks() if task.id.startswith("isodate-")]
TESTS = "src/isodate/tests/test_duration.py"
DECIDING = cast(list[str], TASK.scoring()["deciding"])
# Long enough for the suite on a loaded machine (1-3 s here), short enough for the import-time loop.
ATTACK_TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def gateway(runsc: Path, base_image: ImageRef, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url, process, log = start_local_serve(
        tmp_path_factory.mktemp("attacks"), warm=2, extra_args=["--tasks"], timeout=900
    )
    yield url
    stop_local_serve(process, log)


def scoring(timeout_s: float = ATTACK_TIMEOUT_S) -> dict[str, object]:
    return {**TASK.scoring(), "timeout_s": timeout_s}


def fixed_source(sandbox: Sandbox, task: Task) -> tuple[str, str]:
    """The module's text with the bug, and fixed."""
    broken = sandbox.read_file(task.bug_path).decode()
    return broken, apply_edit(broken, task.broken, task.original)


def attack_in(sandbox: Sandbox, attack: Attack) -> None:
    _, fixed = fixed_source(sandbox, TASK)
    program = script(attack, TASK.bug_edit.file, TESTS, fixed, DECIDING)
    made = sandbox.exec(["python3", "-c", program], cwd=TASK.tree, timeout_s=60)
    assert made.ok, f"the attack itself failed: {made.stderr}"


def test_the_bug_scores_0_and_the_honest_fix_1(gateway: str) -> None:
    with Fleet(gateway, token=TOKEN) as fleet, fleet.lease("python") as sandbox:
        bug = sandbox.score(task=scoring())
        assert (bug.outcome, bug.reward) == (Outcome.FAILED, 0.0), bug.reason
        assert bug["deciding"]["not_passing"] == [
            {"name": "src.isodate.tests.test_duration.DurationTest::test_parseerror", "outcome": "failed"}
        ]
        _, fixed = fixed_source(sandbox, TASK)
        sandbox.write_file(TASK.bug_path, fixed)
        honest = sandbox.score(task=scoring())
        assert (honest.outcome, honest.reward) == (Outcome.PASSED, 1.0), honest.reason
        assert honest["deciding"] == {"total": len(DECIDING), "passed": len(DECIDING), "not_passing": []}
        assert honest["carried"] == {"changed": [TASK.bug_edit.file], "deleted": []}
        assert honest["tampered"] == []


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_every_attack_scores_0_on_the_loops_scoring_path(gateway: str, attack: Attack) -> None:
    with Fleet(gateway, token=TOKEN) as fleet, fleet.lease("python") as sandbox:
        attack_in(sandbox, attack)
        result = sandbox.score(task=scoring())
        assert (str(result.outcome), result.reward) == (attack.outcome, 0.0), result.reason
        if attack.reported:
            assert result["tampered"], f"{attack.name} went unreported: {result.reason}"


def test_an_attack_scores_0_through_the_gateways_http_api(gateway: str) -> None:
    with Fleet(gateway, token=TOKEN) as fleet, fleet.lease("python") as sandbox:
        attack_in(sandbox, _named("conftest.py at the tree's root"))
        answer = httpx.post(
            f"{gateway}/v1/leases/{sandbox.lease.id}/evaluate",
            json={"task": scoring()},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=120,
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert (body["outcome"], body["reward"], body["reward_source"]) == ("failed", 0.0, "deciding_tests")
        assert any("conftest.py" in entry for entry in body["tampered"])


def test_an_attack_scores_0_through_the_cli(gateway: str) -> None:
    with Fleet(gateway, token=TOKEN) as fleet, fleet.lease("python") as sandbox:
        attack_in(sandbox, _named("early exit: os._exit(0) at import"))
        env = {**os.environ, "SANDFLEET_URL": gateway, "SANDFLEET_TOKEN": TOKEN}
        argv = ["evaluate", sandbox.lease.id, "--task", TASK.id, "--json"]
        ran = subprocess.run(
            [sys.executable, "-m", "sandfleet.cli", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert ran.returncode == 1, ran.stderr
        report = json.loads(ran.stdout)
        assert (report["outcome"], report["reward"]) == ("failed", 0.0)
        assert "ended before pytest finished" in report["outcome_reason"]


def test_an_attack_scores_0_through_the_gym_adapter(gateway: str) -> None:
    # The adapters pass their configured evaluate body through: a catalogue task's is its scoring.
    with Fleet(gateway, token=TOKEN) as fleet:
        env = SandboxEnv(fleet, "python", instruction="fix the bug", evaluate={"task": scoring()})
        try:
            env.reset(seed=1)
            conftest = {"tool": "write", "path": f"{TASK.tree}/conftest.py", "content": PASSING_CONFTEST}
            observation = env.step(conftest)[0]
            assert observation.startswith("wrote "), observation
            _, reward, terminated, _, info = env.step({"tool": "submit"})
            assert (reward, terminated, info["outcome"]) == (0.0, True, "failed")
        finally:
            env.close()


def test_an_attack_scores_0_through_the_skyrl_adapter(gateway: str) -> None:
    register()
    config = {"url": gateway, "token": TOKEN, "pool": "python", "evaluate": {"task": scoring()}}
    env = skyrl_gym.make(ENV_ID, env_config=OmegaConf.create(config))
    assert isinstance(env, SandfleetTextEnv)
    try:
        env.init([{"role": "user", "content": "fix the bug"}])
        plant = f"import pathlib; pathlib.Path({TASK.tree!r}, 'conftest.py').write_text({PASSING_CONFTEST!r})"
        planted = env.step(f"<tool><python>{plant}</python></tool>")
        assert planted["metadata"]["exit_code"] == 0, planted
        final = env.step("Every test passes now. <solution></solution>")
        assert (final["reward"], final["done"], final["metadata"]["outcome"]) == (0.0, True, "failed")
    finally:
        env.close()


async def test_an_attack_scores_0_through_the_verl_tool(gateway: str, tmp_path: Path) -> None:
    config = {"url": gateway, "token": TOKEN, "pool": "python", "evaluate": {"task": scoring()}}
    config["type"] = "native"  # verl's loader asks every tool config for its type
    schema = {"type": "function", "function": {"name": "sandbox", "description": "run a command"}}
    tools = {
        "tools": [
            {"class_name": "sandfleet.adapters.verl.SandboxTool", "config": config, "tool_schema": schema}
        ]
    }
    path = tmp_path / "tool.yaml"
    path.write_text(yaml.safe_dump(tools))
    (tool,) = initialize_tools_from_config(str(path))
    assert isinstance(tool, SandboxTool)
    instance, _ = await tool.create()
    try:
        program = script(_named("sitecustomize.py"), TASK.bug_edit.file, TESTS, "", DECIDING)
        command = f"cd {TASK.tree} && python3 -c {shlex.quote(program)}"
        _, _, metrics = await tool.execute(instance, {"command": command})
        assert metrics["exit_code"] == 0, metrics
        assert await tool.calc_reward(instance) == 0.0
        # The same path pays the honest fix, so the 0 was the attack's, not a failed evaluation.
        fix = (
            f"import pathlib; p = pathlib.Path({TASK.bug_path!r}); "
            f"p.write_text(p.read_text().replace({TASK.broken!r}, {TASK.original!r}, 1))"
        )
        command = f"rm {TASK.tree}/sitecustomize.py && python3 -c {shlex.quote(fix)}"
        _, _, metrics = await tool.execute(instance, {"command": command})
        assert metrics["exit_code"] == 0, metrics
        assert await tool.calc_reward(instance) == 1.0
    finally:
        await tool.release(instance)


def test_a_bad_task_object_is_a_clear_400(gateway: str) -> None:
    with Fleet(gateway, token=TOKEN) as fleet, fleet.lease("python") as sandbox:
        answer = httpx.post(
            f"{gateway}/v1/leases/{sandbox.lease.id}/evaluate",
            json={"task": {**scoring(), "pristine": TASK.tree}},  # the episode's own tree
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=120,
        )
        assert answer.status_code == 422, answer.text
        assert "not root's read-only copy" in answer.text
        mixed = httpx.post(
            f"{gateway}/v1/leases/{sandbox.lease.id}/evaluate",
            json={"task": scoring(), "shell": "true"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=120,
        )
        assert mixed.status_code == 400, mixed.text
        assert "not both" in mixed.text


def _named(name: str) -> Attack:
    (attack,) = [a for a in ATTACKS if a.name == name]
    return attack


# -- scoring in a clean sandbox (gateway.clean_scoring): the tree travels, no process does ---------

# Attacks on the tree itself, and ones that leave something outside it; each must score 0 there too.
CLEAN_ATTACKS = (
    "conftest.py at the tree's root",
    "deciding tests deleted",
    "deciding tests replaced by a link",
    "early exit: os._exit(0) at import",
    "a pytest package at the tree's root",
    "a .pth file",
    "planted bytecode of the fixed module",
    "the fix kept in /tmp, read by the module",
)


def evaluate_clean(gateway: str, lease_id: str, clean: bool = True) -> tuple[dict[str, object], float]:
    """The evaluation of the lease's tree by the task's scoring, in a clean sandbox; and its seconds."""
    started = time.perf_counter()
    answer = httpx.post(
        f"{gateway}/v1/leases/{lease_id}/evaluate",
        params={"clean": "true"} if clean else None,
        json={"task": scoring()},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=180,
    )
    assert answer.status_code == 200, answer.text
    return answer.json(), time.perf_counter() - started


@pytest.mark.parametrize("name", CLEAN_ATTACKS)
def test_an_attack_scores_0_in_a_clean_sandbox(gateway: str, name: str) -> None:
    attack = _named(name)
    with Fleet(gateway, token=TOKEN) as fleet, fleet.lease("python") as sandbox:
        attack_in(sandbox, attack)
        body, _ = evaluate_clean(gateway, sandbox.lease.id)
        # What an attack left outside its tree never travels: there the bug is simply still in place.
        assert body["reward"] == 0.0, body["outcome_reason"]
        assert body["outcome"] in (attack.outcome, "failed"), body["outcome_reason"]


def test_the_honest_fix_scores_1_in_a_clean_sandbox_and_what_that_costs(gateway: str) -> None:
    in_place: list[float] = []
    apart: list[float] = []
    with Fleet(gateway, token=TOKEN) as fleet, fleet.lease("python") as sandbox:
        _, fixed = fixed_source(sandbox, TASK)
        sandbox.write_file(TASK.bug_path, fixed)
        # A link out of the tree and a deleted test helper's neighbour: links stay behind, deletions travel.
        made = sandbox.exec(["ln", "-s", "/etc/passwd", "passwd-link"], cwd=TASK.tree)
        assert made.ok, made.stderr
        for _ in range(3):
            body, seconds = evaluate_clean(gateway, sandbox.lease.id)
            assert (body["outcome"], body["reward"]) == ("passed", 1.0), body["outcome_reason"]
            assert body["carried"] == {"changed": [TASK.bug_edit.file], "deleted": []}
            apart.append(seconds)
            body, seconds = evaluate_clean(gateway, sandbox.lease.id, clean=False)
            assert (body["outcome"], body["reward"]) == ("passed", 1.0), body["outcome_reason"]
            in_place.append(seconds)
    ratio = statistics.median(apart) / statistics.median(in_place)
    print(
        f"\nscoring in place: median {statistics.median(in_place):.2f} s; in a clean sandbox: "
        f"median {statistics.median(apart):.2f} s; ratio {ratio:.2f} (3 each, same serve, warm pool of 2)"
    )


def test_a_file_the_episode_deleted_is_deleted_in_the_clean_sandbox(gateway: str) -> None:
    with Fleet(gateway, token=TOKEN) as fleet, fleet.lease("python") as sandbox:
        removed = sandbox.exec(["rm", TASK.bug_edit.file], cwd=TASK.tree)
        assert removed.ok, removed.stderr
        body, _ = evaluate_clean(gateway, sandbox.lease.id)
        assert body["reward"] == 0.0
        assert body["carried"] == {"changed": [], "deleted": [TASK.bug_edit.file]}


def test_clean_scoring_takes_only_a_task(gateway: str) -> None:
    with Fleet(gateway, token=TOKEN) as fleet, fleet.lease("python") as sandbox:
        answer = httpx.post(
            f"{gateway}/v1/leases/{sandbox.lease.id}/evaluate?clean=true",
            json={"shell": "true"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=60,
        )
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"] == "bad_task"
        assert "takes a `task` object" in answer.json()["detail"]
