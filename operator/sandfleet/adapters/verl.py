"""A verl native tool over sandfleet: `class_name: sandfleet.adapters.verl.SandboxTool` in a tool config.

Written against verl 0.9's `verl.tools.base_tool.BaseTool`: verl's loader
(`verl.tools.tool_registry.initialize_tools_from_config`) builds it as
`SandboxTool(config=..., tool_schema=OpenAIFunctionToolSchema | None)`; `create` returns
`(instance_id, ToolResponse)`, `execute` returns `(ToolResponse, step reward, metrics)`, then
`calc_reward` and `release`. One tool instance is one lease: `create` leases a sandbox,
`release` returns it. verl's ToolAgentLoop makes an instance per tool call (create, execute,
release), so each call gets a fresh sandbox there; a rollout that keeps one instance for a whole
trajectory keeps one sandbox. The model's arguments are `{"command": "..."}` or `{"patch": "..."}`.

`config` keys besides verl's `type: native`: `pool` (default "default"), `image`, `url`, `token`,
`token_file` (else SANDFLEET_URL / SANDFLEET_TOKEN), `labels`, `ttl_seconds`, `timeout_s` (per
command) and `evaluate` (the body `calc_reward` sends to evaluate). A dataset row's
`tools_kwargs.<name>.create_kwargs` may carry `image` and `labels` for its own episode.
"""

from __future__ import annotations

import uuid
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from sandfleet.client import AsyncFleet, AsyncSandbox, SandfleetError

TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "sandbox",
        "description": "Run a shell command in the task's sandbox, or apply a unified diff to it.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "Shell command to run."},
                "patch": {"type": "string", "description": "Unified diff to apply."},
            },
            "required": [],
        },
    },
}
CONFIG_KEYS = frozenset(
    {"type", "pool", "image", "url", "token", "token_file", "labels", "ttl_seconds", "timeout_s", "evaluate"}
)
CREATE_KEYS = frozenset({"image", "labels"})


class ToolConfigError(ValueError):
    """A tool config or call sandfleet cannot use, named in one line."""


def check_config(config: dict[str, Any]) -> dict[str, Any]:
    """The tool's config, refusing unknown keys and ill-typed labels with one clear line."""
    unknown = sorted(set(config) - CONFIG_KEYS)
    if unknown:
        raise ToolConfigError(f"unknown sandfleet tool config keys {unknown}; known: {sorted(CONFIG_KEYS)}")
    labels = config.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise ToolConfigError("sandfleet tool config 'labels' must map names to strings")
    if not isinstance(config.get("evaluate") or {}, dict):
        raise ToolConfigError("sandfleet tool config 'evaluate' must be a mapping (evaluate's body)")
    return config


def tool_call(parameters: dict[str, Any]) -> tuple[str, str]:
    """("patch" | "command", its text) from the model's arguments; one clear line when neither is usable."""
    for key in ("patch", "command"):
        value = parameters.get(key)
        if isinstance(value, str) and value.strip():
            return key, value
    raise ToolConfigError("the sandbox tool needs a non-empty 'command' or 'patch' string")


class SandboxTool(BaseTool):  # type: ignore[misc,unused-ignore]  # typed only where verl is importable
    """verl's BaseTool over sandfleet leases, one per tool instance."""

    def __init__(
        self,
        config: dict[str, Any],
        tool_schema: OpenAIFunctionToolSchema | None = None,
        fleet: AsyncFleet | None = None,
    ) -> None:
        schema = tool_schema or OpenAIFunctionToolSchema.model_validate(TOOL_SCHEMA)
        super().__init__(config=check_config(dict(config)), tool_schema=schema)
        self._fleet = fleet
        self._instances: dict[str, AsyncSandbox] = {}

    @property
    def fleet(self) -> AsyncFleet:
        """The gateway client, made on first use (inside the rollout's event loop)."""
        if self._fleet is None:
            url, token, token_file = (self.config.get(key) for key in ("url", "token", "token_file"))
            self._fleet = AsyncFleet(url, token, token_file=token_file)
        return self._fleet

    async def create(
        self, instance_id: str | None = None, create_kwargs: dict[str, Any] | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        instance_id = instance_id or uuid.uuid4().hex
        if instance_id in self._instances:
            return instance_id, ToolResponse()
        extra = dict(create_kwargs or {})
        unknown = sorted(set(extra) - CREATE_KEYS)
        if unknown:
            raise ToolConfigError(f"unknown create_kwargs {unknown}; known: {sorted(CREATE_KEYS)}")
        labels = {**(self.config.get("labels") or {}), **(extra.get("labels") or {}), "episode": instance_id}
        (lease,) = await self.fleet.acquire(
            self.config.get("pool", "default"),
            labels=labels,
            image=extra.get("image", self.config.get("image")),
            ttl_seconds=self.config.get("ttl_seconds"),
            policy_version=kwargs.get("policy_version"),
        )
        self._instances[instance_id] = AsyncSandbox(self.fleet, lease)
        return instance_id, ToolResponse()

    def _sandbox(self, instance_id: str) -> AsyncSandbox:
        sandbox = self._instances.get(instance_id)
        if sandbox is None:
            raise ToolConfigError(f"no sandbox tool instance {instance_id!r}: call create() first")
        return sandbox

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """(what the model reads, step reward 0, metrics); a bad call or fleet error is text, not a raise."""
        sandbox = self._sandbox(instance_id)
        try:
            kind, text = tool_call(parameters)
            if kind == "patch":
                result = await sandbox.exec(["git", "apply", "-"], stdin=text)
            else:
                result = await sandbox.exec(text, timeout_s=self.config.get("timeout_s"))
        except ToolConfigError as error:
            return ToolResponse(text=f"error: {error}"), 0.0, {"error": "bad_arguments"}
        except SandfleetError as error:
            return ToolResponse(text=f"error: {error.detail}"), 0.0, {"error": error.code}
        output = result.stdout + result.stderr
        if kind == "patch" and result.ok and not output:
            output = "patch applied"
        metrics = {
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "duration_s": result.duration_s,
        }
        return ToolResponse(text=output), 0.0, metrics

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The sandbox's evaluation (the config's `evaluate` body); an infrastructure failure scores 0."""
        outcome = await self._sandbox(instance_id).score(**(self.config.get("evaluate") or {}))
        return outcome.reward

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        sandbox = self._instances.pop(instance_id, None)
        if sandbox is not None:
            await sandbox.release()
