"""Each adapter against the interface it implements, reproduced here from the framework's documentation.

The frameworks are not imported (they pull in GPUs' worth of dependencies); their interfaces are
restated as Protocols and the adapters are checked for conformance and behaviour over a fake gateway.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol, runtime_checkable

import pytest

from sandfleet.adapters.gym import SandboxEnv
from sandfleet.adapters.protocol import FleetSandbox
from sandfleet.client import AsyncFleet, Fleet
from tests.unit.adapters.fake_gateway import FakeGateway


@runtime_checkable
class GymEnv(Protocol):
    """Gymnasium's Env: reset(*, seed, options) -> (obs, info); step(a) -> (obs, r, term, trunc, info)."""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]: ...

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]: ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncSandboxProtocol(Protocol):
    """rLLM / slime rollouts: exec(cmd, timeout) -> (output, exit code), read, write, close."""

    async def exec(self, command: str | list[str], timeout: float | None = None) -> tuple[str, int]: ...  # noqa: ASYNC109

    async def read(self, path: str) -> str: ...

    async def write(self, path: str, content: str | bytes) -> None: ...

    async def close(self) -> None: ...


def same_parameters(implementation: Any, interface: Any, name: str) -> None:
    ours = inspect.signature(getattr(implementation, name))
    theirs = inspect.signature(getattr(interface, name))
    expected = [p for p in theirs.parameters.values() if p.name != "self"]
    got = list(ours.parameters.values())
    for param in expected:
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in got), (name, ours)
            continue
        assert param.name in ours.parameters, (name, param.name, ours)
        assert ours.parameters[param.name].kind == param.kind, (name, param.name)
        assert (ours.parameters[param.name].default is inspect.Parameter.empty) == (
            param.default is inspect.Parameter.empty
        ), (name, param.name)


def test_gym_env_episode() -> None:
    gateway = FakeGateway()
    with Fleet("http://gateway", transport=gateway.transport()) as fleet:
        env = SandboxEnv(fleet, "python", instruction="write 42 to answer.txt", max_steps=3,
                         labels={"run": "r1"}, policy_version=3)  # fmt: skip
        assert isinstance(env, GymEnv)
        for name in ("reset", "step", "close"):
            same_parameters(env, GymEnv, name)
        with pytest.raises(RuntimeError, match="reset"):
            env.step({"tool": "exec", "command": "ls"})
        observation, info = env.reset(seed=7)
        assert observation == "write 42 to answer.txt"
        assert gateway.acquired[-1]["labels"] == {"run": "r1", "seed": "7"}
        assert gateway.acquired[-1]["policy_version"] == 3
        obs, reward, terminated, truncated, info = env.step({"tool": "exec", "command": "ls"})
        assert (obs, reward, terminated, truncated) == ("ran: ls", 0.0, False, False)
        env.step({"tool": "write", "path": "/workspace/answer.txt", "content": "42"})
        assert env.step({"tool": "read", "path": "/workspace/answer.txt"})[0] == "42"
        obs, reward, terminated, truncated, info = env.step({"tool": "submit"})
        assert (reward, terminated, truncated) == (1.0, True, False)
        assert (info["outcome"], info["usable"]) == ("passed", True)
        env.reset()  # a new episode: a new sandbox, the old one released
        assert len(gateway.released) == 1
        assert env.step({"tool": "read", "path": "/nope"})[4] == {"error": "not_found"}
        env.step({"tool": "dance"})
        assert env.step({"tool": "exec", "command": "true"})[3]  # third step: truncated
        env.close()
        env.close()
        assert gateway.live == []


async def test_async_sandbox_protocol() -> None:
    gateway = FakeGateway()
    async with AsyncFleet("http://gateway", transport=gateway.transport()) as fleet:
        sandbox = await FleetSandbox.create(fleet, "python", labels={"run": "r1"})
        assert isinstance(sandbox, AsyncSandboxProtocol)
        for name in ("exec", "read", "write", "close"):
            same_parameters(sandbox, AsyncSandboxProtocol, name)
        assert await sandbox.exec("echo hi", timeout=5) == ("ran: echo hi", 0)
        await sandbox.write("/workspace/answer.txt", "42")
        assert await sandbox.read("/workspace/answer.txt") == "42"
        assert await sandbox.evaluate() == 1.0
        await sandbox.close()
        await sandbox.close()  # idempotent
        assert gateway.released == [sandbox.id]
        async with await FleetSandbox.create(fleet, "python") as scoped:
            await scoped.exec(["true"])
        assert gateway.live == []


async def test_a_steps_sandboxes_come_from_one_batch_acquire() -> None:
    gateway = FakeGateway()
    async with AsyncFleet("http://gateway", transport=gateway.transport()) as fleet:
        sandboxes = await FleetSandbox.create_batch(fleet, "python", 3, min_count=2, labels={"run": "r1"})
        (asked,) = gateway.acquired
        assert (asked["count"], asked["min_count"], asked["labels"]) == (3, 2, {"run": "r1"})
        assert len({sandbox.id for sandbox in sandboxes}) == 3
        for sandbox in sandboxes:
            assert isinstance(sandbox, AsyncSandboxProtocol)
            await sandbox.close()
        assert gateway.live == []
