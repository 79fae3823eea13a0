"""A verl-style tool (BaseTool's create/execute/calc_reward/release): one sandbox per tool instance.

verl calls `create` once per trajectory, `execute` for every tool call the model makes,
`calc_reward` at the end and `release` after; this tool maps that onto one lease. The model's
parameters are `{"command": "..."}` (or `{"patch": "..."}` to apply an edit).
"""

from __future__ import annotations

import uuid
from typing import Any

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
        },
    },
}


class SandboxTool:
    """verl BaseTool-shaped: `config` holds `pool`, optional `labels` and `evaluate` options."""

    def __init__(self, config: dict[str, Any], fleet: AsyncFleet, tool_schema: dict[str, Any] | None = None):
        self.config = config
        self.fleet = fleet
        self.tool_schema = tool_schema or TOOL_SCHEMA
        self._instances: dict[str, AsyncSandbox] = {}

    def get_openai_tool_schema(self) -> dict[str, Any]:
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> str:
        instance_id = instance_id or uuid.uuid4().hex
        if instance_id not in self._instances:
            labels = {**self.config.get("labels", {}), "episode": instance_id}
            (lease,) = await self.fleet.acquire(
                self.config["pool"], labels=labels, policy_version=kwargs.get("policy_version")
            )
            self._instances[instance_id] = AsyncSandbox(self.fleet, lease)
        return instance_id

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[str, float, dict[str, Any]]:
        """(text for the model, step reward, metrics); errors are text for the model, not exceptions."""
        sandbox = self._instances[instance_id]
        try:
            if "patch" in parameters:
                applied = await sandbox.exec(["git", "apply", "-"], stdin=str(parameters["patch"]))
                return (
                    (applied.stdout + applied.stderr) or "patch applied",
                    0.0,
                    {"exit_code": applied.exit_code},
                )
            result = await sandbox.exec(str(parameters.get("command", "")), timeout_s=kwargs.get("timeout_s"))
        except SandfleetError as error:
            return f"error: {error.detail}", 0.0, {"error": error.code}
        return (
            result.stdout + result.stderr,
            0.0,
            {"exit_code": result.exit_code, "duration_s": result.duration_s},
        )

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        outcome = await self._instances[instance_id].evaluate(**self.config.get("evaluate", {}))
        return float(outcome.get("reward", 0.0))

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        sandbox = self._instances.pop(instance_id, None)
        if sandbox is not None:
            await sandbox.release()
