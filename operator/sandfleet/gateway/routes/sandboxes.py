"""The leased sandbox's data plane: exec, jobs, files and evaluate, forwarded to its agent."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from sandfleet.gateway import clean_scoring
from sandfleet.gateway.auth import Caller
from sandfleet.gateway.lease_errors import LeaseGone, UnknownName
from sandfleet.gateway.models import EvaluateResponse, Problem
from sandfleet.gateway.proxy import SandboxUnreachable
from sandfleet.gateway.routes.deps import Authed, JobId, Parts, PartsDep
from sandfleet.gateway.routes.errors import ERRORS


@dataclass(frozen=True)
class AgentRoute:
    """One gateway route under /v1/leases/{lease_id} and the agent route it forwards to."""

    method: str
    suffix: str
    agent_path: str
    stream: bool
    summary: str


AGENT_ROUTES = [
    AgentRoute("POST", "/exec", "/v1/exec", False, "Run a command (argv or shell) and wait for it."),
    AgentRoute("POST", "/exec/stream", "/v1/exec/stream", True, "Run a command, streaming NDJSON events."),
    AgentRoute("POST", "/jobs", "/v1/jobs", False, "Start a background job."),
    AgentRoute("GET", "/jobs", "/v1/jobs", False, "List background jobs."),
    AgentRoute("GET", "/jobs/{job}", "/v1/jobs/{job}", False, "A job's status."),
    AgentRoute("GET", "/jobs/{job}/wait", "/v1/jobs/{job}/wait", False, "Wait for a job to end."),
    AgentRoute("GET", "/jobs/{job}/output", "/v1/jobs/{job}/output", False, "A job's output so far."),
    AgentRoute("POST", "/jobs/{job}/kill", "/v1/jobs/{job}/kill", False, "Kill a job's process group."),
    AgentRoute("DELETE", "/jobs/{job}", "/v1/jobs/{job}", False, "Forget a finished job."),
    AgentRoute("GET", "/files", "/v1/files", False, "Read a file."),
    AgentRoute("PUT", "/files", "/v1/files", False, "Write a file."),
    AgentRoute("DELETE", "/files", "/v1/files", False, "Delete a file or tree."),
    AgentRoute("GET", "/files/list", "/v1/files/list", False, "List a directory."),
    AgentRoute("GET", "/files/stat", "/v1/files/stat", False, "Stat a path."),
    AgentRoute("GET", "/files/archive", "/v1/files/archive", True, "Download a tree as tar."),
    AgentRoute("PUT", "/files/archive", "/v1/files/archive", False, "Upload a tar into a tree."),
    AgentRoute("POST", "/evaluate", "/v1/evaluate", False, "Apply a patch, run the tests, get a reward."),
]

# The agent's bodies as the schema shows them: JSON for POST, bytes (a file, a tar) for PUT.
BODIES: dict[str, dict[str, Any]] = {
    "POST": {"application/json": {"schema": {"type": "object"}}},
    "PUT": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
}


def agent_phase(agent_path: str) -> str:
    """The loop phase an agent call counts as: evaluate runs the tests (scoring), anything else is exec."""
    return "score" if agent_path == "/v1/evaluate" else "exec"


async def forward(
    request: Request, lease_id: str, who: Caller, shared: Parts, agent_path: str, stream: bool
) -> Response:
    """Send `request` on to the agent of `who`'s lease `lease_id`, timed for the metrics and the run."""
    started = time.perf_counter()
    started_wall = time.time()
    try:
        _, sandbox = await shared.service.current(lease_id, who.name)
    except (UnknownName, LeaseGone):
        # An episode run as the image's user (root) that lost its sandbox: its zero, not an error.
        if agent_path == "/v1/evaluate" and shared.lost and (lost := shared.lost.report(lease_id, who.name)):
            return JSONResponse(lost)
        raise
    if agent_path == "/v1/evaluate" and clean_scoring.wanted(
        shared.service.pool(sandbox.pool), request.query_params
    ):
        response, agent_seconds = await clean_scoring.score(
            shared.service, shared.proxy, who.name, lease_id, sandbox, await request.body()
        )
    else:
        url = sandbox.agent_url()
        if url is None:
            raise SandboxUnreachable("the sandbox has no address yet; release it and lease another")
        response, agent_seconds = await shared.proxy.forward(
            request, url, agent_path, stream=stream, sandbox=sandbox.name, episode=sandbox.episodes
        )
    if agent_path.startswith("/v1/exec"):
        shared.metrics.executed(sandbox.cluster, agent_seconds)
    # Every call counts (idle is the time between calls).
    shared.runs.exec_done(lease_id, started_wall, agent_seconds, agent_phase(agent_path))
    total = (time.perf_counter() - started) * 1000
    response.headers["Server-Timing"] = f"exec;dur={agent_seconds * 1000:.2f}, total;dur={total:.2f}"
    return response


def proxied(agent_path: str, stream: bool) -> Callable[..., Awaitable[Response]]:
    """The endpoint forwarding to `agent_path` (its name is part of the operation id: keep it)."""
    if "{job}" in agent_path:

        async def job_route(
            request: Request, lease_id: str, job: JobId, who: Authed, shared: PartsDep
        ) -> Response:
            return await forward(request, lease_id, who, shared, agent_path.format(job=job), stream)

        return job_route

    async def route(request: Request, lease_id: str, who: Authed, shared: PartsDep) -> Response:
        return await forward(request, lease_id, who, shared, agent_path, stream)

    return route


def agent_responses(method: str, agent_path: str) -> dict[int | str, dict[str, Any]]:
    """What the agent itself may answer on a data-plane route (passed through as it is)."""
    responses: dict[int | str, dict[str, Any]] = {
        200: {"description": "The agent's own response, passed through."}
    }
    if method == "POST" and agent_path == "/v1/jobs":
        responses[201] = {"description": "The job started: its status (job_id for the job routes)."}
    if agent_path == "/v1/evaluate":
        responses[200] = {
            "model": EvaluateResponse,
            "description": "The outcome, reward and per-test counts.",
        }
    if method in ("POST", "PUT"):
        responses[413] = {"description": "The body is larger than the agent accepts."}
    # The agent's refusals are reshaped into Problems (`source: sandbox`), like the gateway's own.
    for status in (400, 403, 404, 413, 422, 500):
        described = responses.get(status) or ERRORS.get(status) or {"description": "The agent refused."}
        responses[status] = {"model": Problem, "description": described["description"]}
    return responses


def agent_router() -> APIRouter:
    """A router with one route per entry of AGENT_ROUTES."""
    router = APIRouter(tags=["sandbox"])
    for route in AGENT_ROUTES:
        body = BODIES.get(route.method)
        router.add_api_route(
            f"/v1/leases/{{lease_id}}{route.suffix}",
            proxied(route.agent_path, route.stream),
            methods=[route.method],
            summary=route.summary,
            response_class=Response,
            responses=agent_responses(route.method, route.agent_path),
            openapi_extra={"requestBody": {"content": body}} if body else None,
        )
    return router


router = agent_router()
