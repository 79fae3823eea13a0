"""The SkyRL-gym adapter against the real `skyrl-gym` package (pinned in the `integrations` extra).

Over the fake gateway; tests/e2e/local/test_skyrl_adapter.py runs episodes over real gVisor sandboxes.
"""

from __future__ import annotations

import httpx
import pytest
import skyrl_gym
from omegaconf import OmegaConf
from skyrl_gym.envs.base_text_env import BaseTextEnv

from sandfleet.adapters.skyrl import ENV_ID, SandfleetTextEnv, parse_tool_call, register, solution_patch
from sandfleet.client import Fleet
from tests.unit.adapters.fake_gateway import FakeGateway
from tests.unit.adapters.test_gym import LOST, failing

PROMPT = [{"role": "user", "content": "write 42 to answer.txt"}]


@pytest.mark.parametrize(
    ("action", "call"),
    [
        ("I will look. <tool><bash>ls -la</bash></tool>", ("exec", {"command": "ls -la"})),
        (
            "<tool>\n<python>print(6 * 7)</python>\n</tool>",
            ("exec", {"command": ["python3", "-c", "print(6 * 7)"]}),
        ),
        ("<tool><read> answer.txt </read></tool>", ("read", {"path": "answer.txt"})),
        (
            '<tool><write path="a.py">\nx = 1\n</write></tool>',
            ("write", {"path": "a.py", "content": "x = 1\n"}),
        ),
    ],
)
def test_tool_calls_are_parsed(action: str, call: tuple[str, dict[str, object]]) -> None:
    assert parse_tool_call(action) == call


@pytest.mark.parametrize(
    ("action", "why"),
    [
        ("just text", "no tool call found"),
        ("<tool><bash>ls</tool>", "no tool call found"),
        ("<tool><dance>now</dance></tool>", "unknown tool <dance>"),
        ("<tool><write>no path</write></tool>", "unknown tool <write>"),
    ],
)
def test_what_is_not_a_tool_call_says_why(action: str, why: str) -> None:
    parsed = parse_tool_call(action)
    assert isinstance(parsed, str)
    assert parsed.startswith(why)
    assert "\n" not in parsed


def test_solutions() -> None:
    assert solution_patch("no answer yet") is None
    assert solution_patch("<solution></solution>") == ""
    assert solution_patch("done <solution>\n</solution>") == ""
    assert solution_patch("<solution>\n--- a/x\n+++ b/x\n</solution>") == "--- a/x\n+++ b/x\n"


def test_made_by_skyrl_gym_from_its_config_objects() -> None:
    register()
    register()  # idempotent: SkyRL workers may import the adapter more than once
    assert ENV_ID in skyrl_gym.registry
    gateway = FakeGateway()
    with Fleet("http://gateway", transport=gateway.transport()) as fleet:
        config = OmegaConf.create({"pool": "python", "max_turns": 4, "evaluate": {"shell": "pytest -q"}})
        env = skyrl_gym.make(ENV_ID, env_config=config, extras={"labels": {"run": "r1"}}, fleet=fleet)
        assert isinstance(env, BaseTextEnv)
        assert isinstance(env, SandfleetTextEnv)
        assert (env.pool, env.max_turns, env.evaluate_options) == ("python", 4, {"shell": "pytest -q"})
        prompt, metadata = env.init(PROMPT)
        assert prompt == PROMPT
        assert metadata["lease"] in gateway.live
        assert gateway.acquired[-1]["labels"] == {"run": "r1"}
        env.close()
    assert gateway.live == []


def test_episode_tools_then_solution_is_scored() -> None:
    gateway = FakeGateway()
    with Fleet("http://gateway", transport=gateway.transport()) as fleet:
        env = SandfleetTextEnv({"max_turns": 5}, {}, fleet=fleet)
        with pytest.raises(RuntimeError, match="init"):
            env.step("<tool><bash>ls</bash></tool>")
        env.init(PROMPT)
        out = env.step("<tool><bash>ls</bash></tool>")
        assert out["observations"] == [{"role": "user", "content": "ran: ls"}]
        assert (out["reward"], out["done"], out["metadata"]["exit_code"]) == (0.0, False, 0)
        env.step('<tool><write path="/workspace/answer.txt">42</write></tool>')
        assert (
            env.step("<tool><read>/workspace/answer.txt</read></tool>")["observations"][0]["content"] == "42"
        )
        wrong = env.step("what now?")
        assert wrong["metadata"]["error"] == "bad_tool_call"
        assert wrong["observations"][0]["content"].startswith("no tool call found")
        final = env.step("<solution></solution>")
        assert (final["reward"], final["done"], final["observations"]) == (1.0, True, [])
        assert (final["metadata"]["outcome"], final["metadata"]["usable"], final["metadata"]["turns"]) == (
            "passed",
            True,
            5,
        )
        assert gateway.evaluations[-1] == {}  # an empty solution: the tree as it is, no patch
        assert gateway.live == []  # the episode's end released its sandbox
        env.close()
        env.close()


def test_max_turns_ends_the_episode_with_an_evaluation() -> None:
    gateway = FakeGateway()
    with Fleet("http://gateway", transport=gateway.transport()) as fleet:
        env = SandfleetTextEnv({"max_turns": 2, "evaluate": {"shell": "true"}}, fleet=fleet)
        env.init(PROMPT)
        assert not env.step("<tool><bash>ls</bash></tool>")["done"]
        last = env.step("<tool><bash>ls</bash></tool>")
        assert (last["done"], last["metadata"]["outcome"], last["reward"]) == (True, "failed", 0.0)
        assert gateway.evaluations[-1] == {"shell": "true"}
        env.close()


@pytest.mark.parametrize("action", ["exec", "evaluate"])
def test_infra_errors_are_marked_not_silent_zeros(action: str) -> None:
    gateway = FakeGateway()
    with Fleet("http://gateway", transport=httpx.MockTransport(failing(gateway, action)), retries=0) as fleet:
        env = SandfleetTextEnv(fleet=fleet)
        env.init(PROMPT)
        out = env.step("<tool><bash>ls</bash></tool>" if action == "exec" else "<solution></solution>")
        assert (out["done"], out["reward"]) == (True, 0.0)
        assert (out["metadata"]["outcome"], out["metadata"]["usable"]) == ("infra_error", False)
        if action == "exec":
            assert LOST["detail"] in out["observations"][0]["content"]
        env.close()
    assert gateway.live == []
