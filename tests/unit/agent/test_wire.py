"""The agent's copy of the wire vocabulary is sandfleet.wire's, and its evaluate answers have its fields."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping
from typing import Any

from sandfleet import wire
from sandfleet_agent import wire as agent_wire
from tests.unit.agent.conftest import Agent


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
