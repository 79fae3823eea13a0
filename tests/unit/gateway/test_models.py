"""The gateway's models are sandfleet.wire's bodies, field for field: a rename on either side fails here.

FastAPI validates and publishes the pydantic models (gateway/models.py, gateway/run_models.py); the
client, the CLI and the RL loop write and read the same JSON through wire's TypedDicts, and never
import the models. So each model has a twin in wire with the same fields (by alias) and the same
required ones: a request's required fields; for an answer, every field, since the gateway always
writes them all (the Problem aside, which leaves out what is None). A model inside a model has its
twin inside the twin, and a Literal allows the same words on both sides.
"""

from __future__ import annotations

import inspect
import json
import typing
from typing import Any, Literal, get_args, get_origin, get_type_hints

import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from sandfleet import wire
from sandfleet.client import Lease, QueueFull, SpanReport, error_for
from sandfleet.client.calls import acquire_call, leases_from, publish_call, spans_call
from sandfleet.gateway import models, run_models
from sandfleet.gateway.routes import leases, runs
from sandfleet.gateway.routes.errors import problem

REQUEST = "request"  # what a caller sends: required where the model requires it
ANSWER = "answer"  # what the gateway writes: every field, always
SPARSE = "sparse"  # an answer written without its None fields: required where the model requires it

TWINS: dict[type[BaseModel], tuple[Any, str]] = {
    models.AcquireRequest: (wire.AcquireBody, REQUEST),
    models.AcquireResponse: (wire.AcquireAnswer, ANSWER),
    models.LeaseView: (wire.LeaseJson, ANSWER),
    models.Timings: (wire.TimingsJson, ANSWER),
    models.RenewRequest: (wire.RenewBody, REQUEST),
    models.LeaseResponse: (wire.LeaseAnswer, ANSWER),
    models.LeaseList: (wire.LeasesAnswer, ANSWER),
    models.ReleaseResponse: (wire.ReleaseAnswer, ANSWER),
    models.BulkReleaseResponse: (wire.RunReleaseAnswer, ANSWER),
    models.PoolList: (wire.PoolsAnswer, ANSWER),
    models.PoolView: (wire.PoolJson, ANSWER),
    models.PlaceView: (wire.PlaceJson, ANSWER),
    models.Problem: (wire.ProblemAnswer, SPARSE),
    run_models.PublishPolicy: (wire.PublishPolicyBody, REQUEST),
    run_models.PolicyView: (wire.PolicyAnswer, ANSWER),
    run_models.SpansRequest: (wire.SpansBody, REQUEST),
    run_models.SpanIn: (wire.SpanBody, REQUEST),
    run_models.SpansResponse: (wire.SpansAnswer, ANSWER),
    run_models.ProfileView: (wire.ProfileAnswer, ANSWER),
    run_models.PhaseView: (wire.PhaseJson, ANSWER),
    run_models.VerdictView: (wire.VerdictJson, ANSWER),
}

# The models no sandfleet client writes or reads, and why.
GATEWAY_ONLY: dict[type[BaseModel], str] = {
    models.Strict: "the request models' base: no body of its own",
    models.PrefetchRequest: "POST /v1/prefetch: a trainer's dataloader calls it, the client has no call",
    models.PrefetchImage: "inside PrefetchRequest",
    models.PrefetchResponse: "the answer to POST /v1/prefetch",
    models.EvaluateResponse: "wire.EvaluationReport's schema, held to it by test_evaluate_schema.py",
    run_models.SpansView: "GET /v1/runs/{run}/spans: between gateway replicas (run_peers.py)",
    run_models.SpanView: "inside SpansView",
}

# wire's shapes that are no model's twin, and what holds them.
NOT_TWINS = {
    wire.LeasesQuery: "a query string: test_the_query_strings_are_wires",
    wire.ProfileQuery: "a query string: test_the_query_strings_are_wires",
    wire.ExecBody: "the agent's: tests/unit/agent/test_wire.py",
    wire.ExecAnswer: "the agent's: tests/unit/agent/test_wire.py",
    wire.EvaluateRequest: "the agent's: tests/unit/agent/test_wire.py",
    wire.EvaluationReport: "EvaluateResponse's fields: test_evaluate_schema.py",
}


def keys(shape: Any) -> frozenset[str]:
    return frozenset(shape.__required_keys__ | shape.__optional_keys__)


def inner(annotation: Any) -> tuple[set[Any], set[Any]]:
    """The models or TypedDicts an annotation holds (in lists, dicts, unions), and its Literal words."""
    shapes: set[Any] = set()
    words: set[Any] = set()
    pending = [annotation]
    while pending:
        item = pending.pop()
        if get_origin(item) is Literal:
            words |= set(get_args(item))
        elif inspect.isclass(item) and (issubclass(item, BaseModel) or typing.is_typeddict(item)):
            shapes.add(item)
        else:
            pending.extend(get_args(item))
    return shapes, words


@pytest.mark.parametrize("model", list(TWINS), ids=lambda model: model.__name__)
def test_each_model_has_the_fields_of_its_twin(model: type[BaseModel]) -> None:
    twin, kind = TWINS[model]
    fields = {field.alias or name: field for name, field in model.model_fields.items()}
    assert set(fields) == keys(twin), f"{model.__name__} and wire.{twin.__name__} differ"
    if kind == ANSWER:
        assert not twin.__optional_keys__, f"the gateway always writes every field of {model.__name__}"
    else:
        required = {name for name, field in fields.items() if field.is_required()}
        assert required == twin.__required_keys__, f"{model.__name__} requires {sorted(required)}"


@pytest.mark.parametrize("model", list(TWINS), ids=lambda model: model.__name__)
def test_a_models_inner_models_and_words_are_its_twins(model: type[BaseModel]) -> None:
    twin, _ = TWINS[model]
    hints = get_type_hints(twin)
    for name, field in model.model_fields.items():
        inner_models, model_words = inner(field.annotation)
        inner_twins, twin_words = inner(hints[field.alias or name])
        assert {TWINS[m][0] for m in inner_models} == inner_twins, f"{model.__name__}.{name}"
        assert model_words == twin_words, f"{model.__name__}.{name}"


def test_every_model_is_a_twin_or_says_why_not() -> None:
    defined = {
        cls
        for module in (models, run_models)
        for cls in vars(module).values()
        if inspect.isclass(cls) and issubclass(cls, BaseModel) and cls.__module__ == module.__name__
    }
    assert defined == TWINS.keys() | GATEWAY_ONLY.keys()
    assert not TWINS.keys() & GATEWAY_ONLY.keys()


def test_every_body_in_wire_is_a_models_twin_or_says_what_holds_it() -> None:
    shapes = {value for value in vars(wire).values() if typing.is_typeddict(value)}
    twins = {twin for twin, _ in TWINS.values()}
    assert shapes == twins | NOT_TWINS.keys()
    assert not twins & NOT_TWINS.keys()


def query(app: FastAPI, path: str) -> set[str]:
    """The query parameters of GET `path` in the app's published schema."""
    parameters = app.openapi()["paths"][path]["get"].get("parameters", [])
    return {parameter["name"] for parameter in parameters if parameter["in"] == "query"}


def test_the_query_strings_are_wires() -> None:
    app = FastAPI()
    app.include_router(leases.router)
    app.include_router(runs.router)
    assert query(app, "/v1/leases") == keys(wire.LeasesQuery)
    assert query(app, "/v1/runs/{run}/profile") == keys(wire.ProfileQuery)


def test_what_the_client_sends_the_models_accept() -> None:
    body = acquire_call("python", 4, ["eu"], 60, {"run": "r1"}, 3, 5.0, None, image="task:1", min_count=2)
    acquire = models.AcquireRequest.model_validate_json(json.dumps(body.json))
    assert (acquire.count, acquire.min_count, acquire.idempotency_key) == (4, 2, body.json["idempotency_key"])
    published = run_models.PublishPolicy.model_validate_json(
        json.dumps(publish_call("r1", 3, 2, "flag").json)
    )
    assert (published.version, published.staleness_bound, published.mode) == (3, 2, "flag")
    spans = spans_call("r1", [SpanReport("train", 1.0, 2.0, "learner", "learner")], 1)
    recorded = run_models.SpansRequest.model_validate_json(json.dumps(spans.json))
    assert (recorded.spans[0].source, recorded.dropped_stale) == ("learner", 1)


def test_what_the_models_write_the_client_reads() -> None:
    view = models.LeaseView(
        id="local.sb-1", pool="python", holder="alice", region="eu", sandbox="sb-1", acquired_at=1.0,
        expires_at=61.0, ttl_seconds=60, labels={"run": "r1"}, policy_version=3, idempotency_key="k",
        image_digest="sha256:ab", template_hash="t1",
    )  # fmt: skip
    timings = models.Timings(queue_ms=1.0, claim_ms=2.0, boot_ms=0.0, total_ms=3.5)
    answer = models.AcquireResponse(leases=[view], requested=1, granted=1, queue_position=0, timings=timings)
    (lease,) = leases_from(json.loads(answer.model_dump_json()))
    assert lease == Lease(
        "local.sb-1", "python", "sb-1", "eu", 61.0, {"run": "r1"}, 3, timings.model_dump(), "sha256:ab", "t1"
    )
    refused = problem(429, "queue_full", "the queue is full", queue_position=2, retry_after_seconds=4)
    error = error_for(refused.status_code, json.loads(bytes(refused.body)))
    assert isinstance(error, QueueFull)
    assert (error.code, error.detail, error.retry_after) == ("queue_full", "the queue is full", 4)
