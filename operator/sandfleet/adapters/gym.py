"""A Gymnasium environment (`gymnasium.Env`, checked by `check_env`) whose episodes run in leased sandboxes.

An episode is one lease: `reset` leases a fresh sandbox (releasing the last one), `step` runs one
action, `close` releases. The spaces are what a coding agent honestly exchanges: text.

- Observations are `Text`: the instruction on reset, then each action's output, as printable ASCII
  (other characters escaped) cut to `max_text` characters (see sandfleet.adapters.tools).
- Actions are a `Dict`, one tool call: `tool` (`Discrete(4)`: 0 exec, 1 read, 2 write, 3 submit)
  and its text arguments `command`, `path`, `content`, `patch`; a call leaves the others empty.
  For hand-written agents `tool` may also be the tool's name and unused keys may be left out:
  `{"tool": "exec", "command": "pytest -q"}`, `{"tool": "submit", "patch": "<unified diff>"}`.

`submit` runs the task's tests (`evaluate`, with the constructor's options) and terminates the episode
with its reward; `info` carries the typed `outcome` and `usable` (False for infra_error: mask, do
not learn from, that zero). Other rewards are 0; after `max_steps` actions the episode is truncated,
and it is truncated too, with `usable` False, when the sandbox is lost mid-episode.
"""

from __future__ import annotations

import numbers
import string
from typing import Any

import gymnasium
from gymnasium import spaces

from sandfleet.adapters.tools import OBSERVATION_CHARSET, fit_text, release, run_tool, submit
from sandfleet.client import Fleet, Sandbox

TOOLS = ("exec", "read", "write", "submit")
MAX_PATH = 4096  # PATH_MAX: no file path is longer


class SandboxEnv(gymnasium.Env[str, dict[str, Any]]):
    """Text in, tool calls out, one leased sandbox per episode."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (Gymnasium's own class attribute)

    def __init__(
        self,
        fleet: Fleet,
        pool: str,
        instruction: str = "",
        evaluate: dict[str, Any] | None = None,
        max_steps: int = 32,
        labels: dict[str, str] | None = None,
        policy_version: int | None = None,
        max_text: int = 16384,
    ) -> None:
        self.fleet = fleet
        self.pool = pool
        self.instruction = instruction
        self.evaluate_options = evaluate or {}  # e.g. {"shell": "pytest -q", "cwd": "/workspace/x"}
        self.max_steps = max_steps
        self.labels = labels or {}
        self.policy_version = policy_version
        self.max_text = max_text
        self.sandbox: Sandbox | None = None
        self.steps = 0

        def text(limit: int) -> spaces.Text:
            return spaces.Text(limit, min_length=0, charset=string.printable)

        self.action_space = spaces.Dict(
            {"tool": spaces.Discrete(len(TOOLS)), "command": text(max_text), "path": text(MAX_PATH),
             "content": text(max_text), "patch": text(max_text)}
        )  # fmt: skip
        self.observation_space = spaces.Text(max_text, min_length=0, charset=OBSERVATION_CHARSET)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.close()
        options = options or {}
        labels = {**self.labels, **({"seed": str(seed)} if seed is not None else {})}
        (lease,) = self.fleet.acquire(
            self.pool, labels=labels, policy_version=options.get("policy_version", self.policy_version)
        )
        self.sandbox = Sandbox(self.fleet, lease)
        self.steps = 0
        info = {"lease": lease.id, "sandbox": lease.sandbox, "timings": dict(lease.timings)}
        return fit_text(self.instruction, self.max_text), info

    def step(self, action: dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.sandbox is None:
            raise RuntimeError("call reset() before step(): there is no episode (no lease) yet")
        self.steps += 1
        tool = tool_name(action.get("tool"))
        reward, terminated, lost = 0.0, False, False
        if tool == "submit":
            patch = action.get("patch")
            body = {**self.evaluate_options, **({"patch": patch} if patch else {})}
            result = submit(self.sandbox, body)
            reward, terminated = result.reward, result.scored
        else:
            result = run_tool(self.sandbox, tool or str(action.get("tool")), action)
        observation, info, lost = result.text, result.info, result.sandbox_gone
        truncated = lost or (not terminated and self.steps >= self.max_steps)
        return fit_text(observation, self.max_text), reward, terminated, truncated, info

    def close(self) -> None:
        sandbox, self.sandbox = self.sandbox, None
        if sandbox is not None:
            release(sandbox)


def tool_name(tool: object) -> str | None:
    """The tool an action names: its index in TOOLS (as the action space samples it) or its name."""
    if isinstance(tool, str):
        return tool if tool in TOOLS else None
    if isinstance(tool, numbers.Integral) and 0 <= int(tool) < len(TOOLS):
        return TOOLS[int(tool)]
    return None
