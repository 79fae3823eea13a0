"""The agent's copy of the wire vocabulary is sandfleet.wire's; it reads wire's fields and answers with them.

The agent imports nothing of sandfleet's, so its exec and evaluate bodies are read by name in its own
code: the names it reads are found in that code (`optional_str(body, "cwd")`, `body["task"]`) and
held to ExecBody and EvaluateRequest; its answers are held to ExecAnswer and EvaluationReport.
"""

from __future__ import annotations

import ast
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import sandfleet_agent
from sandfleet import wire
from sandfleet_agent import wire as agent_wire
from tests.unit.agent.conftest import Agent

AGENT = Path(sandfleet_agent.__file__).parent


def test_the_agents_outcomes_are_the_clients() -> None:
    assert tuple(outcome.value for outcome in wire.Outcome) == agent_wire.OUTCOMES
    assert {name: getattr(agent_wire, name) for name in wire.Outcome.__members__} == {
        name: outcome.value for name, outcome in wire.Outcome.__members__.items()
    }


def test_the_agents_reward_sources_are_the_clients() -> None:
    assert tuple(source.value for source in wire.RewardSource) == agent_wire.REWARD_SOURCES
    assert {name: getattr(agent_wire, name) for name in wire.RewardSource.__members__} == {
        name: source.value for name, source in wire.RewardSource.__members__.items()
    }


def test_the_agents_counts_and_error_codes_are_the_clients() -> None:
    assert agent_wire.COUNT_KEYS == wire.COUNT_KEYS
    assert agent_wire.BAD_PATCH == wire.BAD_PATCH
    assert agent_wire.VERIFIER_CANNOT_RUN == wire.VERIFIER_CANNOT_RUN
    assert agent_wire.SCORE_ELSEWHERE == wire.SCORE_ELSEWHERE


def fields_read(module: str, function: str | None = None) -> set[str]:
    """The fields of `body` that a module's functions (or one of them) read, by the names they give."""
    tree = ast.parse((AGENT / f"{module}.py").read_text())
    scopes = [
        node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and function in (None, node.name)
    ]
    assert scopes, f"{module}.py has no function {function}"

    def is_body(node: ast.expr) -> bool:
        return isinstance(node, ast.Name) and node.id == "body"

    read: set[str] = set()
    for node in (inner for scope in scopes for inner in ast.walk(scope)):
        key: ast.expr | None = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2:
            if node.func.id.startswith("optional_") and is_body(node.args[0]):
                key = node.args[1]  # optional_str(body, "cwd")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr == "get" and is_body(node.func.value):
                key = node.args[0]  # body.get("task")
        elif isinstance(node, ast.Subscript) and is_body(node.value):
            key = node.slice  # body["task"]
        if key is not None:
            name = key.value if isinstance(key, ast.Constant) else None
            assert isinstance(name, str), f"{module}.py:{key.lineno} reads a field by a computed name"
            read.add(name)
    return read


def keys(shape: Any) -> set[str]:
    return set(shape.__required_keys__ | shape.__optional_keys__)


def test_the_agent_reads_the_exec_and_evaluate_fields_wire_declares() -> None:
    exec_fields = fields_read("process", "parse_exec_spec")
    assert exec_fields == keys(wire.ExecBody)
    # An evaluation runs its test command as an exec does, then reads its own fields.
    assert "parse_exec_spec" in (AGENT / "evaluate.py").read_text()
    assert exec_fields | fields_read("evaluate") == keys(wire.EvaluateRequest)


def test_the_reader_of_fields_sees_every_way_the_agent_reads_one() -> None:
    # The check above is only as good as this reader: one that found nothing would pass nothing.
    assert {"argv", "shell", "timeout_s"} <= fields_read("process", "parse_exec_spec")  # optional_*()
    assert {"task", "patch"} <= fields_read("evaluate")  # body.get() and optional_str()


def test_an_exec_answers_with_the_declared_fields(agent: Agent) -> None:
    for encoding, optional in (("utf-8", {"stdout_binary", "stderr_binary"}), ("base64", set())):
        answer = agent.exec(argv=["echo", "hi"], encoding=encoding).json()
        assert set(answer) == wire.ExecAnswer.__required_keys__ | optional, encoding
        assert optional <= wire.ExecAnswer.__optional_keys__


def assert_a_report(answer: Mapping[str, Any]) -> None:
    """An evaluate answer with every field EvaluationReport requires, none it does not declare."""
    fields = set(answer)
    required, optional = wire.EvaluationReport.__required_keys__, wire.EvaluationReport.__optional_keys__
    assert required <= fields, f"missing {sorted(required - fields)}"
    assert fields <= required | optional, f"undeclared {sorted(fields - required - optional)}"
    assert answer["outcome"] in set(wire.Outcome)
    assert answer["reward_source"] in set(wire.RewardSource)
    assert tuple(answer["counts"]) == wire.COUNT_KEYS


def test_a_command_evaluation_answers_with_the_declared_fields(agent: Agent) -> None:
    # A spoiled reward file and report, and a timeout: every optional field of the command form.
    verifier = '"$SANDFLEET_VERIFIER_DIR"'
    spoiled = f'echo x > {verifier}/reward.txt; echo "<testsuite" > {verifier}/junit.xml; sleep 30'
    answer = agent.client.post("/v1/evaluate", json={"shell": spoiled, "timeout_s": 0.5}).json()
    assert {"outcome_reason", "reward_error", "tests_error"} <= set(answer)
    assert_a_report(answer)
    assert_a_report(agent.client.post("/v1/evaluate", json={"shell": "true"}).json())


def test_a_task_evaluation_answers_with_the_declared_fields(agent: Agent) -> None:
    pristine = agent.root.parent / "pristine"
    (pristine / "tests").mkdir(parents=True)
    (pristine / "tests" / "__init__.py").write_text("")
    (pristine / "tests" / "test_it.py").write_text("def test_it():\n    assert True\n")
    shutil.copytree(pristine, agent.root / "episode")
    task = {
        "tree": "episode",
        "pristine": str(pristine),
        "deciding": ["tests.test_it::test_it"],
        "pytest_args": ["-q", "-p", "no:cacheprovider", "-p", "no:asyncio"],
        "python": sys.executable,
        "timeout_s": 60,
    }
    answer = agent.client.post("/v1/evaluate", json={"task": task}).json()
    assert (answer["outcome"], answer["reward_source"]) == ("passed", "deciding_tests"), answer
    assert {"deciding", "tampered", "carried"} <= set(answer)
    assert_a_report(answer)
