"""sandfleet's verl tool as verl 0.9.1's own loader builds it from a YAML tool config (no gateway needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.verl_without_gpu import install

install()

from verl.tools.base_tool import BaseTool  # noqa: E402
from verl.tools.schemas import OpenAIFunctionToolSchema  # noqa: E402
from verl.tools.tool_registry import initialize_tools_from_config  # noqa: E402

from sandfleet.adapters.verl import (  # noqa: E402
    TOOL_SCHEMA,
    SandboxTool,
    ToolConfigError,
    check_config,
    tool_call,
)

CONFIG = Path(__file__).resolve().parents[2] / "fixtures" / "verl" / "sandbox_tool.yaml"


def test_verls_loader_builds_the_tool_from_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFLEET_POOL", "python")
    (tool,) = initialize_tools_from_config(str(CONFIG))
    assert isinstance(tool, SandboxTool)
    assert isinstance(tool, BaseTool)
    assert tool.name == "sandbox"
    assert tool.config["pool"] == "python"  # the YAML's interpolation, resolved by verl's OmegaConf
    assert tool.config["labels"] == {"run": "verl-e2e"}
    # What verl's ToolAgentLoop puts in the prompt: the schema dumped as the model sees it.
    dumped = tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
    assert dumped["function"]["name"] == "sandbox"
    assert set(dumped["function"]["parameters"]["properties"]) == {"command", "patch"}


def test_default_schema_is_verls_schema_type() -> None:
    tool = SandboxTool(config={"type": "native", "pool": "p"}, tool_schema=None)
    assert isinstance(tool.tool_schema, OpenAIFunctionToolSchema)
    assert tool.get_openai_tool_schema().model_dump(exclude_unset=True) == TOOL_SCHEMA


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"type": "native", "pol": "x"}, r"unknown sandfleet tool config keys \['pol'\]"),
        ({"type": "native", "labels": {"run": 3}}, "'labels' must map names to strings"),
        ({"type": "native", "labels": ["a"]}, "'labels' must map names to strings"),
        ({"type": "native", "evaluate": "pytest"}, "'evaluate' must be a mapping"),
    ],
)
def test_bad_configs_are_one_clear_line(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ToolConfigError, match=message):
        check_config(config)


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({"command": "ls"}, ("command", "ls")),
        ({"patch": "--- a\n+++ b\n", "command": "ls"}, ("patch", "--- a\n+++ b\n")),
        ({"patch": "", "command": "pwd"}, ("command", "pwd")),
    ],
)
def test_tool_call_reads_the_models_arguments(parameters: dict[str, Any], expected: tuple[str, str]) -> None:
    assert tool_call(parameters) == expected


@pytest.mark.parametrize("parameters", [{}, {"command": "  "}, {"command": 3}, {"cmd": "ls"}])
def test_unusable_arguments_are_refused(parameters: dict[str, Any]) -> None:
    with pytest.raises(ToolConfigError, match="non-empty 'command' or 'patch'"):
        tool_call(parameters)


async def test_unknown_instance_and_create_kwargs_are_refused() -> None:
    tool = SandboxTool(config={"type": "native"})
    with pytest.raises(ToolConfigError, match="call create"):
        await tool.execute("nope", {"command": "ls"})
    with pytest.raises(ToolConfigError, match=r"unknown create_kwargs \['pool'\]"):
        await tool.create(create_kwargs={"pool": "other"})
    await tool.release("nope")  # releasing what was never created is a no-op, as verl expects
