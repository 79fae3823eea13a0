"""The Gymnasium adapter against the real `gymnasium` package (pinned in the `integrations` extra).

Here over the fake gateway, so the checker's many resets cost nothing; tests/e2e/local/test_gym_adapter.py
runs the same checker over real gVisor sandboxes.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable

import httpx
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from sandfleet.adapters.gym import TOOLS, SandboxEnv, tool_name
from sandfleet.adapters.tools import OBSERVATION_CHARSET, fit_text
from sandfleet.client import Fleet
from tests.unit.adapters.fake_gateway import FakeGateway

LOST = {"error": "sandbox_lost", "detail": "the sandbox's agent stopped answering"}


def failing(gateway: FakeGateway, action: str) -> Callable[[httpx.Request], httpx.Response]:
    """The fake gateway, except that `action` (exec, evaluate) answers 502: the sandbox is lost."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith(f"/{action}"):
            return httpx.Response(502, json=LOST)
        return gateway.handle(request)

    return handle


def test_check_env_passes_without_warnings() -> None:
    gateway = FakeGateway()
    with Fleet("http://gateway", transport=gateway.transport()) as fleet:
        env = SandboxEnv(fleet, "python", instruction="write 42 to answer.txt", max_text=512)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env, skip_render_check=True)  # no rendering: render_modes is empty
        env.close()
    assert [str(w.message) for w in caught] == []
    assert len(gateway.acquired) > 1  # every reset leased a fresh sandbox ...
    assert gateway.live == []  # ... and released the last one


def test_sampled_actions_are_tool_calls_and_observations_stay_in_space() -> None:
    gateway = FakeGateway()
    with Fleet("http://gateway", transport=gateway.transport()) as fleet:
        env = SandboxEnv(fleet, "python", max_text=64)
        env.action_space.seed(5)
        env.reset(seed=5)
        for _ in range(8):
            action = env.action_space.sample()
            assert tool_name(action["tool"]) in TOOLS
            observation, *_ = env.step(action)
            assert observation in env.observation_space
        env.close()


def test_tool_names_and_indices() -> None:
    assert [tool_name(i) for i in range(len(TOOLS))] == list(TOOLS)
    assert tool_name(np.int64(3)) == "submit"
    assert tool_name("read") == "read"
    assert tool_name(len(TOOLS)) is None
    assert tool_name("dance") is None
    assert tool_name(-1) is None
    assert tool_name(None) is None


def test_bad_actions_are_one_line_errors() -> None:
    gateway = FakeGateway()
    with Fleet("http://gateway", transport=gateway.transport()) as fleet:
        env = SandboxEnv(fleet, "python")
        env.reset()
        observation, reward, terminated, truncated, info = env.step({"tool": "exec"})
        assert (observation, info) == (
            "error: the tool call needs 'command' as text",
            {"error": "bad_tool_call"},
        )
        assert (reward, terminated, truncated) == (0.0, False, False)
        observation, *_, info = env.step({"tool": 9})
        assert observation.startswith("error: unknown tool '9'")
        assert info == {"error": "unknown_tool"}
        env.close()


@pytest.mark.parametrize("action", ["exec", "evaluate"])
def test_a_lost_sandbox_is_an_infra_error_not_a_zero(action: str) -> None:
    gateway = FakeGateway()
    transport = httpx.MockTransport(failing(gateway, action))
    with Fleet("http://gateway", transport=transport, retries=0) as fleet:
        env = SandboxEnv(fleet, "python")
        env.reset()
        tool = {"tool": "exec", "command": "ls"} if action == "exec" else {"tool": "submit"}
        observation, reward, terminated, truncated, info = env.step(tool)
        assert (info["outcome"], info["usable"]) == ("infra_error", False)
        assert reward == 0.0
        assert LOST["detail"] in observation
        if action == "exec":  # the episode cannot go on: cut short, not an ending the policy earned
            assert (terminated, truncated) == (False, True)
        else:  # the evaluation ended the episode, and its zero is marked unusable
            assert (terminated, truncated) == (True, False)
        env.close()
    assert gateway.live == []


def test_fit_text_escapes_and_cuts() -> None:
    hostile = "ok\x1b[31mred\r\n\u00e9\u4e2d\x00"
    fitted = fit_text(hostile, 100)
    assert set(fitted) <= OBSERVATION_CHARSET
    assert fitted == "ok\\x1b[31mred\\r\n\\xe9\\u4e2d\\x00"
    long = "".join(f"line {i}\n" for i in range(1000))
    cut = fit_text(long, 200)
    assert len(cut) == 200
    assert cut.startswith("line 0\n")
    assert cut.endswith("line 999\n")
    assert f"cut: {len(long)} characters in all" in cut
    assert fit_text(long, len(long)) == long
    assert len(fit_text(long, 5)) == 5


def test_exec_info_is_plain_data() -> None:
    gateway = FakeGateway()
    with Fleet("http://gateway", transport=gateway.transport()) as fleet:
        env = SandboxEnv(fleet, "python")
        env.reset()
        *_, info = env.step({"tool": "exec", "command": ["echo", "hi"], "timeout_s": 5})
        assert info == {"exit_code": 0, "timed_out": False}
        assert json.loads(json.dumps(info)) == info
        env.close()
