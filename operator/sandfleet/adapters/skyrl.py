"""A SkyRL-gym text environment (`skyrl_gym.envs.base_text_env.BaseTextEnv`) whose episodes run in a sandbox.

`init(prompt)` leases a sandbox from the pool; `step(action)` runs the tool call in the model's text,
in SkyRL-gym's own convention (its `searchcode` env): one `<tool><NAME>...</NAME></tool>` block.

- `<tool><bash>pytest -q</bash></tool>`: a shell command in /workspace;
- `<tool><python>print(6 * 7)</python></tool>`: Python code (`python3 -c`);
- `<tool><read>calc.py</read></tool>`, `<tool><write path="calc.py">...</write></tool>`: a file.

The episode ends with `<solution>...</solution>` (its content, if any, is a unified diff applied
first) or after `max_turns` turns: the task's tests then run (`evaluate`) and give the reward.
`metadata` carries the typed `outcome` and `usable`: an `infra_error` (the fleet failed, not the
model) is a 0.0 reward with `usable` False, to be masked, never a silent zero; a sandbox lost
mid-episode ends it the same way.

Configuration (SkyRL's `env_config`, overridden per sample by `extras`): `pool`, `evaluate` (the
test command: `shell`/`argv`, `cwd`, ...), `max_turns`, `labels`, `policy_version`, `max_text`,
and the gateway's `url`/`token` (default: SANDFLEET_URL, SANDFLEET_TOKEN), unless a `fleet` is given.
`register()` makes it `skyrl_gym.make("sandfleet", ...)`, SkyRL's way to build an episode's env.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

from sandfleet.adapters.tools import ToolResult, fit_text, release, run_tool, submit
from sandfleet.client import Fleet, Sandbox

ENV_ID = "sandfleet"  # the id `register` gives it in skyrl-gym's registry
TOOL_CALL = re.compile(r"<tool>\s*<(\w+)((?:\s+\w+=\"[^\"]*\")*)\s*>(.*?)</\1>\s*</tool>", re.DOTALL)
ATTRIBUTE = re.compile(r"(\w+)=\"([^\"]*)\"")
SOLUTION = re.compile(r"<solution>(.*?)</solution>", re.DOTALL)
USAGE = (
    "use one <tool><bash>...</bash></tool>, <tool><python>...</python></tool>, <tool><read>path</read></tool>"
    ' or <tool><write path="...">content</write></tool>, or finish with <solution>patch or nothing</solution>'
)


def register() -> None:
    """Register SandfleetTextEnv as `skyrl_gym.make("sandfleet", env_config=..., extras=...)` (idempotent)."""
    if ENV_ID not in skyrl_gym.registry:
        skyrl_gym.register(id=ENV_ID, entry_point=f"{__name__}:SandfleetTextEnv")


def parse_tool_call(action: str) -> tuple[str, dict[str, Any]] | str:
    """The tool call (run_tool's name and arguments) in the model's text, or why there is none."""
    match = TOOL_CALL.search(action)
    if match is None:
        return f"no tool call found: {USAGE}"
    name, attributes, body = match.group(1), dict(ATTRIBUTE.findall(match.group(2))), match.group(3)
    if name == "bash":
        return "exec", {"command": body}
    if name == "python":
        return "exec", {"command": ["python3", "-c", body]}
    if name == "read":
        return "read", {"path": body.strip()}
    if name == "write" and "path" in attributes:
        return "write", {"path": attributes["path"], "content": body.removeprefix("\n")}
    return f"unknown tool <{name}>: {USAGE}"


def solution_patch(action: str) -> str | None:
    """The patch in the model's `<solution>` (empty: test the tree as it is), or None if it gave none."""
    match = SOLUTION.search(action)
    if match is None:
        return None
    patch = match.group(1).strip("\n")
    return f"{patch}\n" if patch.strip() else ""


class SandfleetTextEnv(BaseTextEnv):
    """Text in, tool calls out, one leased sandbox per episode, the reward from the task's tests."""

    def __init__(
        self,
        env_config: Mapping[str, Any] | None = None,
        extras: Mapping[str, Any] | None = None,
        *,
        fleet: Fleet | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # skyrl-gym's is unannotated
        settings = {**_plain(env_config or {}), **_plain(extras or {})}
        self.pool = str(settings.get("pool", "python"))
        self.evaluate_options = dict(settings.get("evaluate") or {})
        self.max_turns = int(settings.get("max_turns", 8))
        self.max_text = int(settings.get("max_text", 16384))
        self.labels = {str(k): str(v) for k, v in dict(settings.get("labels") or {}).items()}
        self.policy_version = settings.get("policy_version")
        self._owns_fleet = fleet is None
        self.fleet = fleet if fleet is not None else Fleet(settings.get("url"), settings.get("token"))
        self.sandbox: Sandbox | None = None

    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        self.close_sandbox()
        (lease,) = self.fleet.acquire(self.pool, labels=self.labels, policy_version=self.policy_version)
        self.sandbox = Sandbox(self.fleet, lease)
        self.turns = 0
        return prompt, {"lease": lease.id, "sandbox": lease.sandbox}

    # BaseTextEnv.step itself narrows Env.step's EnvStepOutput to BaseTextEnvStepOutput.
    def step(self, action: str) -> BaseTextEnvStepOutput:  # type: ignore[override]
        if self.sandbox is None:
            raise RuntimeError("call init() before step(): there is no episode (no lease) yet")
        self.turns += 1
        patch = solution_patch(action)
        if patch is not None or self.turns >= self.max_turns:
            result = submit(self.sandbox, {**self.evaluate_options, **({"patch": patch} if patch else {})})
            self.close_sandbox()
            return self._output(None, result, done=True)
        call = parse_tool_call(action)
        if isinstance(call, str):
            return self._output(call, ToolResult(call, {"error": "bad_tool_call"}), done=False)
        result = run_tool(self.sandbox, *call)
        if result.sandbox_gone:
            self.close_sandbox()
        return self._output(_shown(result), result, done=result.sandbox_gone)

    def close_sandbox(self) -> None:
        sandbox, self.sandbox = self.sandbox, None
        if sandbox is not None:
            release(sandbox)

    def close(self) -> None:
        self.close_sandbox()
        if self._owns_fleet:
            self.fleet.close()

    def _output(self, text: str | None, result: ToolResult, *, done: bool) -> BaseTextEnvStepOutput:
        observations = (
            [{"role": "user", "content": fit_text(text, self.max_text)}] if text is not None else []
        )
        metadata = {**result.info, "turns": self.turns}
        return BaseTextEnvStepOutput(
            observations=observations,
            reward=result.reward,
            done=done,
            metadata=metadata,
            postprocessed_action=None,
        )


def _shown(result: ToolResult) -> str:
    """The tool's output, and how a command ended when it did not end well (the model sees only text)."""
    if result.info.get("timed_out"):
        return f"{result.text}\n[timed out]"
    code = result.info.get("exit_code")
    return f"{result.text}\n[exit code {code}]" if code not in (None, 0) else result.text


def _plain(value: Any) -> Any:
    """Plain dicts and lists out of SkyRL's config objects (OmegaConf's DictConfig, ListConfig)."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [_plain(item) for item in value]
    return value
