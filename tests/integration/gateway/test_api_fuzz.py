"""schemathesis over the gateway's whole OpenAPI with every check (tests/support/contract.py's exceptions).

Two runs: every operation on its own (examples, coverage and fuzzing phases), then the stateful
phase, which follows the schema's OpenAPI links (acquire -> get, renew, exec, files, jobs ->
release) with real lease ids, so the data plane is reached with leases that exist.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.gateway.conftest import GatewayFactory, Pool, loopback_sandbox
from tests.support.contract import EXCLUDED_CHECKS, config_file

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[3]


def schemathesis(
    url: str, tmp_path: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    report = tmp_path / "junit.xml"
    return subprocess.run(
        [
            str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(config_file(tmp_path)),
            "run", f"{url}/openapi.json",
            "--header", "Authorization: Bearer actor-token",
            # One worker: the AST parsing hypothesis does to describe strategies is not thread-safe
            # on CPython 3.11 ("AST constructor recursion depth mismatch").
            "--request-timeout", "30", "--workers", "1",
            "--generation-deterministic", "--report", "junit", "--report-junit-path", str(report),
            *extra,
        ],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,  # it writes .schemathesis/
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_schemathesis_finds_no_server_errors_or_undocumented_statuses(
    pool: Pool, start_gateway: GatewayFactory, agent: int, tmp_path: Path
) -> None:
    # The only sandbox points at a loopback agent, so no generated call leaves this machine;
    # a queue of 0 answers 429 at once instead of letting generated waits of minutes block.
    loopback_sandbox(pool, agent)
    gateway = start_gateway(max_waiting=0)
    result = schemathesis(
        gateway.url,
        tmp_path,
        "--phases",
        "examples,coverage,fuzzing",
        "--checks",
        "all",
        "--exclude-checks",
        EXCLUDED_CHECKS,
        "--max-examples",
        "30",
    )
    assert result.returncode == 0, result.stdout[-6000:]
    assert "passed" in result.stdout


def test_the_schema_links_a_lease_to_every_route_that_takes_it(
    pool: Pool, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway()
    with gateway.client() as client:
        schema = client.get("/openapi.json").json()
    links = schema["paths"]["/v1/leases"]["post"]["responses"]["201"]["links"]
    lease_routes = {
        operation["operationId"]
        for path, operations in schema["paths"].items()
        if "{lease_id}" in path and "{job}" not in path
        for operation in operations.values()
    }
    assert set(links) == lease_routes
    assert all(
        link["parameters"] == {"path.lease_id": "$response.body#/leases/0/id"} for link in links.values()
    )
    jobs = schema["paths"]["/v1/leases/{lease_id}/jobs"]["post"]["responses"]["201"]["links"]
    assert {link["parameters"]["path.job"] for link in jobs.values()} == {"$response.body#/job_id"}


def test_stateful_schemathesis_follows_leases_through_their_life(
    pool: Pool, start_gateway: GatewayFactory, agent: int, tmp_path: Path
) -> None:
    # Enough loopback sandboxes that chains of acquire -> ... -> release keep finding warm ones
    # (nothing refills them here); the data-plane calls reach the real agent process.
    for index in range(12):
        loopback_sandbox(pool, agent, index)
    gateway = start_gateway(max_waiting=0)
    result = schemathesis(
        gateway.url,
        tmp_path,
        "--phases", "stateful",
        "--checks", "all", "--exclude-checks", EXCLUDED_CHECKS,
        "--max-examples", "40",
        # Acquires name the pool that exists, so the chains have lease ids to follow.
        env={"SCHEMATHESIS_HOOKS": "tests.integration.gateway.schemathesis_hooks", "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:]
    assert "Stateful" in result.stdout, result.stdout[-3000:]
    # The links were followed: leases were acquired and then used, not guessed.
    covered = re.search(r"API Links:\s+(\d+) covered", result.stdout)
    assert covered is not None, result.stdout[-3000:]
    assert int(covered.group(1)) >= 10, result.stdout[-3000:]
