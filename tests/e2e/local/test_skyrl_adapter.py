"""The SkyRL-gym adapter, built by the real `skyrl-gym` package's registry, over real gVisor sandboxes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import skyrl_gym
from omegaconf import OmegaConf

from sandfleet.adapters.skyrl import ENV_ID, SandfleetTextEnv, register
from sandfleet.client import Fleet
from sandfleet.local.artifacts import ImageRef
from tests.support.answer_task import ANSWER_IS_42, ANSWER_PATCH, INSTRUCTION, serving

pytestmark = pytest.mark.gvisor

PROMPT = [{"role": "user", "content": INSTRUCTION}]


@pytest.fixture(scope="module")
def gateway(runsc: Path, base_image: ImageRef, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `sandfleet serve --local` with warm sandboxes of pool `python`."""
    with serving(tmp_path_factory.mktemp("skyrl")) as url:
        yield url


def make(gateway: str, **extras: Any) -> SandfleetTextEnv:
    """The env as a SkyRL generator builds it: `skyrl_gym.make(id, env_config=..., extras=...)`."""
    register()
    config = OmegaConf.create(
        {"url": gateway, "token": "local-token", "pool": "python", "max_turns": 6, "evaluate": ANSWER_IS_42}
    )
    env = skyrl_gym.make(ENV_ID, env_config=config, extras={"labels": {"run": "skyrl-e2e"}, **extras})
    assert isinstance(env, SandfleetTextEnv)
    return env


def content(output: Any) -> str:
    (message,) = output["observations"]
    assert message["role"] == "user"
    return str(message["content"])


def test_tool_calls_run_in_the_sandbox_and_the_solution_is_evaluated(gateway: str) -> None:
    env = make(gateway)
    prompt, _ = env.init(PROMPT)
    assert prompt == PROMPT
    assert content(env.step("Let me compute. <tool><python>print(6 * 7)</python></tool>")) == "42\n"
    kernel = content(env.step("<tool><bash>dmesg | head -1</bash></tool>"))
    assert "gVisor" in kernel
    written = env.step("<tool><bash>echo 42 > answer.txt; cat answer.txt</bash></tool>")
    assert (content(written), written["reward"], written["done"]) == ("42\n", 0.0, False)
    failed = env.step("<tool><bash>echo nope >&2; exit 3</bash></tool>")
    assert content(failed) == "nope\n\n[exit code 3]"
    assert failed["metadata"]["exit_code"] == 3
    final = env.step("The file holds 42. <solution></solution>")
    assert (final["reward"], final["done"], final["observations"]) == (1.0, True, [])
    assert (final["metadata"]["outcome"], final["metadata"]["usable"]) == ("passed", True)
    env.close()


def test_a_patch_in_the_solution_is_applied_then_tested(gateway: str) -> None:
    env = make(gateway)
    env.init(PROMPT)
    final = env.step(f"Here is the fix:\n<solution>\n{ANSWER_PATCH}</solution>")
    assert (final["reward"], final["metadata"]["outcome"]) == (1.0, "passed")
    env.close()
    wrong = make(gateway, max_turns=1)  # per-sample extras override the env config
    wrong.init(PROMPT)
    out = wrong.step("<tool><bash>echo 41 > answer.txt</bash></tool>")  # the last turn: evaluated
    assert (out["done"], out["reward"], out["metadata"]["outcome"], out["metadata"]["usable"]) == (
        True,
        0.0,
        "failed",
        True,
    )
    wrong.close()


def test_a_sandbox_gone_mid_episode_is_an_infra_error(gateway: str) -> None:
    env = make(gateway)
    _, metadata = env.init(PROMPT)
    with Fleet(gateway, token="local-token") as fleet:
        assert fleet.release(metadata["lease"])  # the lease ends behind the episode's back
        out = env.step("<tool><bash>ls</bash></tool>")
        assert (out["done"], out["reward"]) == (True, 0.0)
        assert (out["metadata"]["outcome"], out["metadata"]["usable"]) == ("infra_error", False)
        env.close()
        assert fleet.leases(pool="python") == []
