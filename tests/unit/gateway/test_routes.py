"""The gateway's routers: the API they assemble to (paths, operation ids, 405s) and their pure helpers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from sandfleet.core import api
from sandfleet.core.leases import LeaseError
from sandfleet.core.model import SandboxPod
from sandfleet.core.queueing import Admission
from sandfleet.gateway.app import Runtime, create_app
from sandfleet.gateway.auth import Authenticator, Unauthenticated
from sandfleet.gateway.backend import PoolInfo
from sandfleet.gateway.disconnect import ClientGone
from sandfleet.gateway.lease_errors import LeaseGone, NotTheHolder, PoolQueueFull, UnknownName, WaitTimeout
from sandfleet.gateway.lease_requests import Granted
from sandfleet.gateway.models import EvaluateResponse, Problem
from sandfleet.gateway.routes.deps import Parts
from sandfleet.gateway.routes.errors import PROBLEMS, problem_for, validation_detail
from sandfleet.gateway.routes.leases import granted_result, refused_result
from sandfleet.gateway.routes.pools import pool_view
from sandfleet.gateway.routes.sandboxes import AGENT_ROUTES, agent_phase, agent_responses

# Clients, the OpenAPI links and schemathesis's stateful phase name operations by these ids.
OPERATION_IDS = {
    ("GET", "/healthz"): "healthz_healthz_get",
    ("GET", "/metrics"): "metrics_endpoint_metrics_get",
    ("GET", "/readyz"): "readyz_readyz_get",
    ("GET", "/v1/leases"): "list_leases_v1_leases_get",
    ("POST", "/v1/leases"): "acquire_v1_leases_post",
    ("DELETE", "/v1/leases/{lease_id}"): "release_v1_leases__lease_id__delete",
    ("GET", "/v1/leases/{lease_id}"): "get_lease_v1_leases__lease_id__get",
    ("POST", "/v1/leases/{lease_id}/evaluate"): "route_v1_leases__lease_id__evaluate_post",
    ("POST", "/v1/leases/{lease_id}/exec"): "route_v1_leases__lease_id__exec_post",
    ("POST", "/v1/leases/{lease_id}/exec/stream"): "route_v1_leases__lease_id__exec_stream_post",
    ("DELETE", "/v1/leases/{lease_id}/files"): "route_v1_leases__lease_id__files_delete",
    ("GET", "/v1/leases/{lease_id}/files"): "route_v1_leases__lease_id__files_get",
    ("PUT", "/v1/leases/{lease_id}/files"): "route_v1_leases__lease_id__files_put",
    ("GET", "/v1/leases/{lease_id}/files/archive"): "route_v1_leases__lease_id__files_archive_get",
    ("PUT", "/v1/leases/{lease_id}/files/archive"): "route_v1_leases__lease_id__files_archive_put",
    ("GET", "/v1/leases/{lease_id}/files/list"): "route_v1_leases__lease_id__files_list_get",
    ("GET", "/v1/leases/{lease_id}/files/stat"): "route_v1_leases__lease_id__files_stat_get",
    ("GET", "/v1/leases/{lease_id}/jobs"): "route_v1_leases__lease_id__jobs_get",
    ("POST", "/v1/leases/{lease_id}/jobs"): "route_v1_leases__lease_id__jobs_post",
    ("DELETE", "/v1/leases/{lease_id}/jobs/{job}"): "job_route_v1_leases__lease_id__jobs__job__delete",
    ("GET", "/v1/leases/{lease_id}/jobs/{job}"): "job_route_v1_leases__lease_id__jobs__job__get",
    ("POST", "/v1/leases/{lease_id}/jobs/{job}/kill"): "job_route_v1_leases__lease_id__jobs__job__kill_post",
    (
        "GET",
        "/v1/leases/{lease_id}/jobs/{job}/output",
    ): "job_route_v1_leases__lease_id__jobs__job__output_get",
    ("GET", "/v1/leases/{lease_id}/jobs/{job}/wait"): "job_route_v1_leases__lease_id__jobs__job__wait_get",
    ("POST", "/v1/leases/{lease_id}/renew"): "renew_v1_leases__lease_id__renew_post",
    ("GET", "/v1/pools"): "list_pools_v1_pools_get",
    ("POST", "/v1/prefetch"): "prefetch_v1_prefetch_post",
    ("GET", "/v1/runs/{run}/policy"): "get_policy_v1_runs__run__policy_get",
    ("POST", "/v1/runs/{run}/policy"): "publish_policy_v1_runs__run__policy_post",
    ("GET", "/v1/runs/{run}/profile"): "get_profile_v1_runs__run__profile_get",
    ("POST", "/v1/runs/{run}/release"): "release_run_v1_runs__run__release_post",
    ("GET", "/v1/runs/{run}/spans"): "get_spans_v1_runs__run__spans_get",
    ("POST", "/v1/runs/{run}/spans"): "report_spans_v1_runs__run__spans_post",
}


class NoSandboxes:
    """Just enough of a Backend to assemble an app: no pools, no sandboxes."""

    def subscribe(self, on_change: Callable[..., None]) -> None:
        return None

    def pools(self) -> list[Any]:
        return []

    def sandbox(self, lease_id: str) -> None:
        return None

    async def fresh(self, lease_id: str) -> None:
        return None


async def noop() -> None:
    return None


def app() -> FastAPI:
    authenticator = Authenticator(static_tokens={}, anonymous_allowed=True)
    runtime = Runtime(NoSandboxes(), authenticator, ready=lambda: True, start=noop, stop=noop)  # type: ignore[arg-type]
    return create_app(runtime)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app())
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        yield client


def test_the_routers_assemble_to_the_same_operations_and_ids() -> None:
    paths: dict[str, dict[str, Any]] = app().openapi()["paths"]
    found = {(m.upper(), path): op["operationId"] for path, ops in paths.items() for m, op in ops.items()}
    assert found == OPERATION_IDS


def test_the_acquire_links_reach_every_lease_route_of_every_router() -> None:
    paths: dict[str, dict[str, Any]] = app().openapi()["paths"]
    links = paths["/v1/leases"]["post"]["responses"]["201"]["links"]
    lease_routes = {
        op for (_, path), op in OPERATION_IDS.items() if "{lease_id}" in path and "{job}" not in path
    }
    assert set(links) == lease_routes


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PATCH", "/v1/leases", "GET, POST"),
        ("PUT", "/v1/leases/ns.s0", "DELETE, GET"),
        ("PATCH", "/v1/leases/ns.s0/files", "DELETE, GET, PUT"),
        ("POST", "/v1/leases/ns.s0/jobs/abc", "DELETE, GET"),
        ("GET", "/v1/runs/r1/release", "POST"),
        ("DELETE", "/v1/runs/r1/policy", "GET, POST"),
        ("POST", "/healthz", "GET"),
        ("POST", "/docs", "GET, HEAD"),
    ],
)
async def test_a_405_names_every_method_of_its_path_whichever_router_serves_it(
    client: httpx.AsyncClient, method: str, path: str, allow: str
) -> None:
    response = await client.request(method, path)
    assert response.status_code == 405
    assert response.headers["Allow"] == allow
    assert response.json() == {
        "error": "method_not_allowed",
        "detail": f"{method} is not allowed on this path; it accepts {allow}",
    }


async def test_routes_reach_the_shared_parts_of_their_own_app(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/pools")).json() == {"pools": []}
    missing = await client.get("/v1/leases/ns.nope")
    assert missing.status_code == 404
    assert missing.json()["error"] == "not_found"
    assert (await client.get("/readyz")).json() == {"status": "ready"}


def test_each_app_gets_its_own_parts() -> None:
    first, second = app().state.parts, app().state.parts
    assert isinstance(first, Parts)
    assert isinstance(second, Parts)
    assert first.service is not second.service
    assert first.metrics.registry is not second.metrics.registry


def test_an_error_answers_with_its_nearest_listed_class() -> None:
    assert problem_for(Unauthenticated("no token")) == (401, "unauthenticated")
    assert problem_for(LeaseGone("ended")) == (410, "lease_ended")
    assert problem_for(LeaseError("bad ttl")) == (422, "invalid_lease")

    class Stricter(NotTheHolder):
        pass

    assert problem_for(Stricter("no")) == PROBLEMS[NotTheHolder]
    with pytest.raises(StopIteration):
        problem_for(RuntimeError("not listed"))


def test_a_validation_error_names_each_field_in_one_line() -> None:
    errors: list[dict[str, Any]] = [
        {"loc": ("body", "count"), "msg": "too big"},
        {"loc": ("body",), "msg": "Field required"},
        {"loc": ("path", "job")},
    ]
    assert validation_detail(errors) == "count: too big; body: Field required; path.job: invalid"


def test_a_refused_acquire_is_counted_by_why() -> None:
    assert refused_result(WaitTimeout("python", 3, 1.5)) == "timeout"
    assert refused_result(ClientGone("hung up")) == "abandoned"
    admission = Admission(admitted=False, position=10, eta_seconds=2.0, retry_after_seconds=2)
    assert refused_result(PoolQueueFull("python", admission)) == "rejected"
    assert refused_result(UnknownName("no pool")) == "rejected"


@pytest.mark.parametrize(
    ("position", "queue_seconds", "boot_seconds", "result"),
    [
        (0, 0.0, 0.0, "warm_hit"),
        (0, 0.05, 0.0, "warm_hit"),
        (0, 0.06, 0.0, "queued"),
        (2, 0.0, 0.0, "queued"),
        (2, 1.0, 0.5, "cold"),
        (0, 0.0, 0.1, "cold"),
    ],
)
def test_a_grant_is_counted_as_warm_queued_or_cold(
    position: int, queue_seconds: float, boot_seconds: float, result: str
) -> None:
    granted = Granted([], queue_seconds, 0.01, position, boot_seconds)
    assert granted_result(granted) == result


def test_evaluate_counts_as_scoring_and_every_other_agent_call_as_exec() -> None:
    assert agent_phase("/v1/evaluate") == "score"
    assert {agent_phase(r.agent_path) for r in AGENT_ROUTES if r.suffix != "/evaluate"} == {"exec"}


def test_agent_responses_declare_what_the_agent_may_answer() -> None:
    start_job = agent_responses("POST", "/v1/jobs")
    assert {201, 413} <= set(start_job)
    listing = agent_responses("GET", "/v1/jobs")
    assert 201 not in listing
    assert (
        listing[413]["description"]
        == "The body is larger than the route accepts (1 MiB for control routes by default)."
    )
    # The agent's refusals are reshaped into Problems by the proxy: one error shape on every route.
    assert listing[404]["model"] is Problem
    assert agent_responses("POST", "/v1/evaluate")[200]["model"] is EvaluateResponse


def test_a_pool_is_listed_per_cluster_and_region() -> None:
    info = PoolInfo("ns", "python", 60, 600, ("eu", "us"), "img")

    def sandbox(name: str, cluster: str, region: str, state: str) -> SandboxPod:
        return SandboxPod("ns", name, "python", region, state=state, ready=True, cluster=cluster)

    sandboxes = [
        sandbox("a", "m1", "us", api.LEASE_FREE),
        sandbox("b", "m0", "eu", api.LEASE_FREE),
        sandbox("c", "m0", "eu", api.LEASE_LEASED),
        sandbox("d", "m1", "us", api.LEASE_LEASED),
        sandbox("e", "m1", "eu", api.LEASE_FREE),
    ]
    view = pool_view(info, sandboxes, waiting=2)
    assert (view.warm, view.leased, view.waiting) == (3, 2, 2)
    assert [p.model_dump() for p in view.places] == [
        {"cluster": "m0", "region": "eu", "warm": 1, "leased": 1},
        {"cluster": "m1", "region": "eu", "warm": 1, "leased": 0},
        {"cluster": "m1", "region": "us", "warm": 1, "leased": 1},
    ]
