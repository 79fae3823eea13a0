"""A gym-style environment (reset/step, the Gymnasium signature) for OpenRLHF- and SkyRL-style agents.

An episode is one lease: `reset` leases a fresh sandbox (releasing the last one), `step` runs one
action, `close` releases. Actions are dicts, since agent frameworks emit tool calls:

- `{"tool": "exec", "command": "pytest -q" | [...], "timeout_s": 60}` -> observation is the output;
- `{"tool": "read", "path": "..."}` / `{"tool": "write", "path": "...", "content": "..."}`;
- `{"tool": "submit", "patch": "<unified diff>"?}` -> runs the task's tests; reward, terminated.

Rewards are 0 until the episode is submitted; after `max_steps` actions the episode is truncated.
"""

from __future__ import annotations

from typing import Any

from sandfleet.client import Fleet, Sandbox, SandfleetError


class SandboxEnv:
    """gymnasium.Env-compatible in shape (no gymnasium import): reset, step, close."""

    def __init__(
        self,
        fleet: Fleet,
        pool: str,
        instruction: str = "",
        evaluate: dict[str, Any] | None = None,
        max_steps: int = 32,
        labels: dict[str, str] | None = None,
        policy_version: int | None = None,
    ) -> None:
        self.fleet = fleet
        self.pool = pool
        self.instruction = instruction
        self.evaluate_options = evaluate or {}  # e.g. {"shell": "pytest -q", "cwd": "/workspace/x"}
        self.max_steps = max_steps
        self.labels = labels or {}
        self.policy_version = policy_version
        self.sandbox: Sandbox | None = None
        self.steps = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        self.close()
        options = options or {}
        labels = {**self.labels, **({"seed": str(seed)} if seed is not None else {})}
        (lease,) = self.fleet.acquire(
            self.pool, labels=labels, policy_version=options.get("policy_version", self.policy_version)
        )
        self.sandbox = Sandbox(self.fleet, lease)
        self.steps = 0
        return self.instruction, {"lease": lease.id, "sandbox": lease.sandbox, "timings": lease.timings}

    def step(self, action: dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.sandbox is None:
            raise RuntimeError("call reset() before step(): there is no episode (no lease) yet")
        self.steps += 1
        tool = action.get("tool")
        reward, terminated = 0.0, False
        info: dict[str, Any] = {}
        try:
            if tool == "exec":
                result = self.sandbox.exec(action["command"], timeout_s=action.get("timeout_s"))
                observation = result.stdout + result.stderr
                info = {"exit_code": result.exit_code, "timed_out": result.timed_out}
            elif tool == "read":
                observation = self.sandbox.read_file(action["path"]).decode(errors="replace")
            elif tool == "write":
                self.sandbox.write_file(action["path"], action["content"])
                observation = f"wrote {action['path']}"
            elif tool == "submit":
                body = {**self.evaluate_options, **({"patch": action["patch"]} if "patch" in action else {})}
                outcome = self.sandbox.evaluate(**body)
                reward, terminated = float(outcome.get("reward", 0.0)), True
                observation = str(outcome.get("exec", {}).get("stdout_tail", ""))
                info = {"evaluation": outcome}
            else:
                observation = f"unknown tool {tool!r}: use exec, read, write or submit"
        except SandfleetError as error:  # the agent sees the error as an observation, like a shell would
            observation, info = f"error: {error.detail}", {"error": error.code}
        truncated = not terminated and self.steps >= self.max_steps
        return observation, reward, terminated, truncated, info

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.release()
            self.sandbox = None
