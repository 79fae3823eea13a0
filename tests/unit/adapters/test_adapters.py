"""Each adapter against the interface it implements, reproduced here from the framework's documentation.

The frameworks are not imported (they pull in GPUs' worth of dependencies); their interfaces are
restated as Protocols and the adapters are checked for conformance and behaviour over a fake gateway.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pytest

from sandfleet.adapters.gym import SandboxEnv
from sandfleet.adapters.harbor import HarborTask, HarborTaskError
from sandfleet.adapters.protocol import FleetSandbox
from sandfleet.adapters.verl import SandboxTool
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


@runtime_checkable
class VerlBaseTool(Protocol):
    """verl's BaseTool: create -> id; execute -> (response, step reward, metrics); calc_reward; release."""

    def get_openai_tool_schema(self) -> Any: ...

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> str: ...

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[str, float, dict[str, Any]]: ...

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float: ...

    async def release(self, instance_id: str, **kwargs: Any) -> None: ...


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


async def test_verl_tool() -> None:
    gateway = FakeGateway()
    async with AsyncFleet("http://gateway", transport=gateway.transport()) as fleet:
        tool = SandboxTool(
            {"pool": "python", "labels": {"run": "r1"}, "evaluate": {"shell": "pytest"}}, fleet
        )
        assert isinstance(tool, VerlBaseTool)
        for name in ("create", "execute", "calc_reward", "release"):
            same_parameters(tool, VerlBaseTool, name)
        assert tool.get_openai_tool_schema()["function"]["name"] == "sandbox"
        instance = await tool.create(policy_version=2)
        assert await tool.create(instance) == instance  # create is idempotent per instance
        assert len(gateway.acquired) == 1
        assert gateway.acquired[0]["labels"] == {"run": "r1", "episode": instance}
        text, step_reward, metrics = await tool.execute(instance, {"command": "echo 42 > answer.txt"})
        assert (text, step_reward, metrics["exit_code"]) == ("ran: echo 42 > answer.txt", 0.0, 0)
        text, _, _ = await tool.execute(instance, {"patch": "--- a/x\n+++ b/x\n"})
        assert text.startswith("ran: git apply -")
        assert await tool.calc_reward(instance) == 0.0
        assert gateway.evaluations[-1] == {"shell": "pytest"}
        await tool.release(instance)
        await tool.release(instance)
        assert gateway.live == []


def harbor_task(root: Path) -> Path:
    (root / "environment").mkdir(parents=True)
    (root / "environment" / "Dockerfile").write_text("FROM python:3.11\n")
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("grep -q 42 answer.txt && echo 1 > /logs/verifier/reward.txt\n")
    (root / "tests" / "data" / "expected.txt").parent.mkdir()
    (root / "tests" / "data" / "expected.txt").write_text("42\n")
    (root / "instruction.md").write_text("Write 42 to answer.txt.\n")
    return root


async def test_harbor_task_is_verified_in_the_sandbox(tmp_path: Path) -> None:
    task = HarborTask.load(harbor_task(tmp_path / "answer-task"))
    assert task.name == "answer-task"
    assert task.instruction.startswith("Write 42")
    assert set(task.tests) == {"test.sh", "data/expected.txt"}
    gateway = FakeGateway()
    async with (
        AsyncFleet("http://gateway", transport=gateway.transport()) as fleet,
        fleet.lease("python") as sandbox,
    ):
        assert await task.verify(sandbox) == 0.0
        await sandbox.write_file("/workspace/answer.txt", "42")
        assert await task.verify(sandbox) == 1.0
        lease = sandbox.lease.id
    assert gateway.files[lease]["/workspace/tests/test.sh"].startswith(b"grep")
    assert "/workspace/tests/data/expected.txt" in gateway.files[lease]
    assert gateway.evaluations[-1] == {"cwd": "/workspace"}


def test_not_a_harbor_task(tmp_path: Path) -> None:
    (tmp_path / "instruction.md").write_text("x")
    with pytest.raises(HarborTaskError, match=r"tests/test.sh, environment/"):
        HarborTask.load(tmp_path)
