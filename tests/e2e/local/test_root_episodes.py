"""Episodes whose commands run as root (`serve --commands-as-image-user`): scored in a clean sandbox.

The catalogue's isodate task image names no User, so its commands run as root inside gVisor, as
task images expect. Root can reach the agent and rewrite everything in its own sandbox, the task's
pristine copy included, so the gateway scores every such episode in a fresh sandbox of the same
image with only the episode's tree carried there (gateway/clean_scoring.py). The honest fix
scores 1; the tree attacks and root's own (rewriting the pristine copy and the test venv, stopping
the agent) score 0, a stopped agent as `failed`, never a masked infra_error.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import httpx
import pytest

from sandfleet.client import Fleet, Outcome, Sandbox
from sandfleet.local.artifacts import ImageRef
from sandfleet.rl.catalogue_tasks import apply_edit, load_tasks
from tests.support.reward_attacks import ATTACKS, NEUTRALISED_TESTS, script
from tests.support.servers import start_local_serve, stop_local_serve

pytestmark = pytest.mark.gvisor

TOKEN = "local-token"
(TASK,) = [task for task in load_tasks() if task.id.startswith("isodate-")]
TESTS = "src/isodate/tests/test_duration.py"
DECIDING = cast(list[str], TASK.scoring()["deciding"])
PRISTINE = cast(str, TASK.scoring()["pristine"])


@pytest.fixture(scope="module")
def gateway(runsc: Path, base_image: ImageRef, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url, process, log = start_local_serve(
        tmp_path_factory.mktemp("root-episodes"),
        warm=2,
        extra_args=["--tasks", "--commands-as-image-user"],
        timeout=900,
    )
    yield url
    stop_local_serve(process, log)


def scoring() -> dict[str, object]:
    return {**TASK.scoring(), "timeout_s": 60.0}


def fixed(sandbox: Sandbox) -> str:
    return apply_edit(sandbox.read_file(TASK.bug_path).decode(), TASK.broken, TASK.original)


def root_does(sandbox: Sandbox, shell: str) -> None:
    made = sandbox.exec(["sh", "-c", shell], cwd=TASK.tree, timeout_s=60)
    assert made.ok, f"the attack itself failed: {made.stderr}"


def test_commands_run_as_root_and_the_honest_fix_scores_1(gateway: str) -> None:
    with Fleet(gateway, token=TOKEN) as fleet, fleet.lease("python") as sandbox:
        who = sandbox.exec(["sh", "-c", "id -u; echo $HOME; touch /opt/written-by-root"])
        assert who.stdout.split() == ["0", "/root"], who.stderr
        bug = sandbox.score(task=scoring())
        assert (bug.outcome, bug.reward) == (Outcome.FAILED, 0.0), bug.reason
        sandbox.write_file(TASK.bug_path, fixed(sandbox))
        honest = sandbox.score(task=scoring())
        assert (honest.outcome, honest.reward) == (Outcome.PASSED, 1.0), honest.reason
        assert honest["carried"] == {"changed": [TASK.bug_edit.file], "deleted": []}


def test_a_setuid_root_program_gives_another_user_nothing(gateway: str) -> None:
    # Root can make a setuid-root program (in the tree it could carry to the clean sandbox, where the
    # verifier runs the tests): gVisor ignores set-id bits (runsc has no --allow-suid) and every
    # process inherits no_new_privs from the sandbox's first one, so it runs as whoever starts it.
    with Fleet(gateway, token=TOKEN) as fleet, fleet.lease("python") as sandbox:
        made = sandbox.exec(
            [
                "sh",
                "-c",
                "cp /usr/bin/id ./euid && chmod 4755 ./euid && stat -c '%a %u' ./euid && "
                "setpriv --reuid=4242 --regid=4242 --clear-groups ./euid -u && "
                "setpriv --reuid=4242 --regid=4242 --clear-groups grep NoNewPrivs /proc/self/status",
            ],
            cwd=TASK.tree,
        )
        assert made.ok, made.stderr
        assert made.stdout.split() == ["4755", "0", "4242", "NoNewPrivs:", "1"], made.stdout


@pytest.mark.parametrize(
    "name", ["conftest.py at the tree's root", "deciding tests deleted", "early exit: os._exit(0) at import"]
)
def test_a_tree_attack_by_root_scores_0(gateway: str, name: str) -> None:
    (attack,) = [a for a in ATTACKS if a.name == name]
    with Fleet(gateway, token=TOKEN) as fleet, fleet.lease("python") as sandbox:
        program = script(attack, TASK.bug_edit.file, TESTS, fixed(sandbox), DECIDING)
        made = sandbox.exec(["python3", "-c", program], cwd=TASK.tree, timeout_s=60)
        assert made.ok, made.stderr
        result = sandbox.score(task=scoring())
        assert result.reward == 0.0, result.reason
        assert str(result.outcome) in (attack.outcome, "failed"), result.reason


def test_root_rewriting_the_pristine_copy_and_the_test_venv_scores_0(gateway: str) -> None:
    with Fleet(gateway, token=TOKEN) as fleet, fleet.lease("python") as sandbox:
        neutralise = NEUTRALISED_TESTS.replace("'", "'\\''")
        root_does(
            sandbox,
            # The task's own copy of the tests, and the episode's, both made to pass...
            f"printf '%s\\n' '{neutralise}' | tee -a {PRISTINE}/{TESTS} {TESTS} >/dev/null && "
            # ... and a plugin that passes every test, planted where the test run imports from.
            "for d in $(python3 -c 'import site; print(\" \".join(site.getsitepackages()))') "
            '/workspace/.deps; do [ -d "$d" ] && echo \'import os; os.environ["PYTEST_ADDOPTS"] = "--co"\' '
            '> "$d/zz_sf.pth" || true; done',
        )
        result = sandbox.score(task=scoring())
        assert (result.outcome, result.reward) == (Outcome.FAILED, 0.0), result.reason
        # The episode's edit to its tests is seen, and left out, as on every image.
        assert any(TESTS in entry for entry in result["tampered"]), result["tampered"]


@pytest.mark.parametrize("signal", ["TERM", "KILL"])
def test_root_stopping_the_agent_scores_0_as_failed(gateway: str, signal: str) -> None:
    with Fleet(gateway, token=TOKEN) as fleet, fleet.lease("python") as sandbox:
        sandbox.write_file(TASK.bug_path, fixed(sandbox))  # even with the fix in place
        root_does(sandbox, f"(sleep 0.5; kill -{signal} 1) >/dev/null 2>&1 &")
        time.sleep(3)
        result = sandbox.score(task=scoring())
        # gVisor lets root in the sandbox signal its init, SIGKILL included: the sandbox ends, and
        # that is the episode's doing, scored 0 rather than masked.
        assert (result.outcome, result.reward) == (Outcome.FAILED, 0.0), result.reason
        assert "stopped answering" in str(result.reason)


def test_a_test_command_evaluate_is_refused_where_commands_run_as_root(gateway: str) -> None:
    with Fleet(gateway, token=TOKEN) as fleet, fleet.lease("python") as sandbox:
        answer = httpx.post(
            f"{gateway}/v1/leases/{sandbox.lease.id}/evaluate",
            json={"shell": "true"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=60,
        )
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"] == "bad_task"
