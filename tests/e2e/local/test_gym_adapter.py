"""The Gymnasium adapter, checked by the real `gymnasium` package's own checker, over gVisor sandboxes."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from gymnasium.utils.env_checker import check_env

from sandfleet.adapters.gym import SandboxEnv
from sandfleet.client import Fleet
from sandfleet.local.artifacts import ImageRef
from tests.support.answer_task import ANSWER_IS_42, ANSWER_PATCH, INSTRUCTION, serving

pytestmark = pytest.mark.gvisor


@pytest.fixture(scope="module")
def gateway(runsc: Path, base_image: ImageRef, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `sandfleet serve --local` with warm sandboxes of pool `python`."""
    with serving(tmp_path_factory.mktemp("gym")) as url:
        yield url


def test_check_env_passes_over_gvisor(gateway: str) -> None:
    with Fleet(gateway, token="local-token") as fleet:
        env = SandboxEnv(fleet, "python", instruction=INSTRUCTION, evaluate=ANSWER_IS_42, max_text=2048)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env, skip_render_check=True)  # no rendering: render_modes is empty
        env.close()
        assert [str(w.message) for w in caught] == []
        assert fleet.leases(pool="python") == []  # every reset released the episode before


def test_episodes_edit_a_file_and_are_rewarded_by_evaluate(gateway: str) -> None:
    with Fleet(gateway, token="local-token") as fleet:
        env = SandboxEnv(fleet, "python", instruction=INSTRUCTION, evaluate=ANSWER_IS_42, max_steps=8)
        observation, info = env.reset(seed=1)
        assert observation == INSTRUCTION
        assert info["lease"] in {lease.id for lease in fleet.leases(pool="python")}
        _, reward, terminated, _, info = env.step({"tool": "submit"})
        assert (reward, terminated, info["outcome"], info["usable"]) == (0.0, True, "failed", True)

        env.reset(seed=2)
        observation, _, _, _, info = env.step(
            {"tool": "exec", "command": "echo 41 > answer.txt; cat answer.txt"}
        )
        assert (observation, info) == ("41\n", {"exit_code": 0, "timed_out": False})
        assert env.step({"tool": "write", "path": "answer.txt", "content": "42\n"})[0] == "wrote answer.txt"
        assert env.step({"tool": "read", "path": "answer.txt"})[0] == "42\n"
        observation, reward, terminated, truncated, info = env.step({"tool": "submit"})
        assert (reward, terminated, truncated, info["outcome"], info["usable"]) == (
            1.0,
            True,
            False,
            "passed",
            True,
        )

        env.reset(seed=3)  # a fresh sandbox: the patch alone solves it
        _, reward, _, _, info = env.step({"tool": "submit", "patch": ANSWER_PATCH})
        assert (reward, info["outcome"]) == (1.0, "passed")

        env.reset(seed=4)  # a patch that does not apply is the episode's failure, scored, not masked
        _, reward, terminated, _, info = env.step({"tool": "submit", "patch": "not a diff\n"})
        assert (reward, terminated, info["outcome"], info["usable"]) == (0.0, True, "failed", True)
        env.close()
        assert fleet.leases(pool="python") == []


def test_hostile_output_stays_text_in_the_observation_space(gateway: str) -> None:
    with Fleet(gateway, token="local-token") as fleet:
        env = SandboxEnv(fleet, "python", max_text=256, max_steps=2)
        env.reset()
        observation, *_ = env.step(
            {"tool": "exec", "command": r"printf '\033[2J\303\251\r'; head -c 100000 /dev/zero"}
        )
        assert observation in env.observation_space
        assert observation.startswith("\\x1b[2J\\xe9\\r\\x00")
        assert len(observation) == 256
        _, _, terminated, truncated, _ = env.step({"tool": "read", "path": "/etc/shadow"})
        assert (terminated, truncated) == (False, True)  # max_steps reached; the read was refused, not fatal
        env.close()
