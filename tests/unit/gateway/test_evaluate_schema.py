"""The evaluate answer's schema is sandfleet.wire's (fields, outcomes, reward sources).

It is published as `Evaluation`, the name clients generated from the schema know it by.
"""

from __future__ import annotations

from typing import Any, get_args

from fastapi import FastAPI

from sandfleet.gateway.models import EvaluateResponse
from sandfleet.gateway.routes.sandboxes import agent_router
from sandfleet.wire import COUNT_KEYS, EvaluationReport, Outcome, RewardSource

# Fields the agent writes that the published schema has never declared (it allows more fields):
# adding them would change the schema clients were generated from.
UNPUBLISHED = {"reward_error", "tests_error"}


def evaluate_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """The evaluate route's 200 body in the OpenAPI schema, and the schema's components."""
    app = FastAPI()
    app.include_router(agent_router())
    schema = app.openapi()
    answer = schema["paths"]["/v1/leases/{lease_id}/evaluate"]["post"]["responses"]["200"]
    return answer["content"]["application/json"]["schema"], schema["components"]["schemas"]


def test_the_schema_declares_the_wires_fields() -> None:
    fields = EvaluateResponse.model_fields
    declared = EvaluationReport.__required_keys__ | EvaluationReport.__optional_keys__
    assert set(fields) == declared - UNPUBLISHED
    required = {name for name, field in fields.items() if field.is_required()}
    assert required == EvaluationReport.__required_keys__


def test_the_schemas_outcomes_and_reward_sources_are_the_wires() -> None:
    assert get_args(EvaluateResponse.model_fields["outcome"].annotation) == tuple(Outcome)
    assert get_args(EvaluateResponse.model_fields["reward_source"].annotation) == tuple(RewardSource)
    _, components = evaluate_schema()
    properties = components["Evaluation"]["properties"]
    assert properties["outcome"]["enum"] == [outcome.value for outcome in Outcome]
    assert properties["reward_source"]["enum"] == [source.value for source in RewardSource]
    assert ", ".join(COUNT_KEYS) in properties["counts"]["description"]


def test_the_answer_is_still_published_as_evaluation() -> None:
    reference, components = evaluate_schema()
    assert reference == {"$ref": "#/components/schemas/Evaluation"}
    assert components["Evaluation"]["title"] == "Evaluation"
