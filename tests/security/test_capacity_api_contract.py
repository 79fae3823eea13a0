"""The API contract holds under every check schemathesis has, against a real `serve --local` (gVisor).

Plus the specific holes it found: an acquire the schema allowed but the server refused (`{}`), 405s
without `Allow`, links that gave stateful testing no lease to follow, and requests that could never
be served waiting their whole wait for a 5xx.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.support.capacity import (
    TOKENS,
    CapacityGateway,
    capacity,
    capacity_gateway,
    timed,
)
from tests.support.contract import EXCLUDED_CHECKS, config_file
from tests.support.kube import wait_until
from tests.support.servers import free_port, stop_local_serve, wait_until_ready

pytestmark = pytest.mark.gvisor
__all__ = ["capacity", "capacity_gateway"]

METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")
SAMPLE = {"{lease_id}": "local.nope", "{job}": "abc", "{run}": "r1"}
# CI's budget (the deterministic generator covers every operation well inside it);
# SANDFLEET_FUZZ_SECONDS=900 for a longer hunt.
FUZZ_SECONDS = int(os.environ.get("SANDFLEET_FUZZ_SECONDS", "90"))


def concrete(path: str) -> str:
    for placeholder, value in SAMPLE.items():
        path = path.replace(placeholder, value)
    return path


def test_every_operation_answers_an_undeclared_method_with_its_allow_header(
    capacity: CapacityGateway,
) -> None:
    with capacity.client("tenant-a") as client:
        paths: dict[str, dict[str, Any]] = client.get("/openapi.json").json()["paths"]
        checked = 0
        for path, operations in paths.items():
            declared = {method.upper() for method in operations}
            undeclared = next(m for m in METHODS if m not in declared)
            response = client.request(undeclared, concrete(path))
            assert response.status_code == 405, (path, undeclared, response.text)
            assert "Allow" in response.headers, (path, undeclared)  # before: 24 operations without it
            allowed = {m.strip() for m in response.headers["Allow"].split(",")}
            assert allowed == declared, (path, allowed, declared)
            assert response.json()["error"] == "method_not_allowed"
            checked += 1
        assert checked >= 20


def test_the_schema_and_the_server_agree_an_acquire_needs_a_pool_or_an_image(
    capacity: CapacityGateway,
) -> None:
    with capacity.client("tenant-a") as client:
        schema = client.get("/openapi.json").json()
        acquire = schema["components"]["schemas"]["AcquireRequest"]
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({}, acquire)  # before: the schema took `{}` and the server refused it
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"pool": None}, acquire)
        jsonschema.validate({"pool": "python"}, acquire)
        jsonschema.validate({"image": "task:1"}, acquire)
        refused = client.post("/v1/leases", json={})
        assert refused.status_code == 422, refused.text
        assert "give a pool, an image, or both" in refused.json()["detail"]


def test_the_pools_link_gives_stateful_testing_a_real_lease(capacity: CapacityGateway) -> None:
    with capacity.client("tenant-a") as client:
        schema = client.get("/openapi.json").json()
        links = schema["paths"]["/v1/pools"]["get"]["responses"]["200"]["links"]
        ((name, link),) = links.items()
        assert link["operationId"] == schema["paths"]["/v1/leases"]["post"]["operationId"]
        pools = client.get("/v1/pools").json()
        # Resolve the link's runtime expressions as a stateful tester does.
        body = {
            key: pools["pools"][0]["name"] if value == "$response.body#/pools/0/name" else value
            for key, value in link["requestBody"].items()
        }
        granted = client.post("/v1/leases", json=body)
        assert granted.status_code == 201, (name, granted.text)
        lease = granted.json()["leases"][0]["id"]
        acquired = schema["paths"]["/v1/leases"]["post"]["responses"]["201"]["links"]
        assert acquired, "the acquire response links its lease to the lease routes"
        assert client.get(f"/v1/leases/{lease}").status_code == 200


def test_an_image_the_pool_never_runs_is_refused_at_once(capacity: CapacityGateway) -> None:
    with capacity.client("tenant-a") as client:
        refused, seconds = timed(
            client.post, "/v1/leases", json={"pool": "python", "image": "other:1", "wait_seconds": 10}
        )
    assert refused.status_code == 422, refused.text  # before: the whole wait, then a 504
    assert seconds < 5
    assert refused.json()["error"] == "image_not_served"


@pytest.fixture(scope="module")
def fuzz_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway of its own for schemathesis (4 warm; 8 leases per tenant bounds what it creates)."""
    directory = tmp_path_factory.mktemp("fuzz")
    tokens = directory / "tokens"
    tokens.write_text("".join(f"{token} {name}\n" for name, token in TOKENS.items()))
    port = free_port()
    log = directory / "serve.log"
    argv = [
        sys.executable, "-m", "sandfleet.cli", "serve", "--local", "--port", str(port), "--warm", "4",
        "--pool", "python", "--token-file", str(tokens), "--policy-file", str(directory / "policies.json"),
    ]  # fmt: skip
    env = {**os.environ, "SANDFLEET_GATEWAY_MAX_LEASES_PER_TENANT": "8"}
    with log.open("wb") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, process, log, timeout=180, what="sandfleet serve to have a warm sandbox")
        gateway = CapacityGateway(url, process, log)
        wait_until(lambda: gateway.pool()["warm"] >= 4, timeout=120, what="4 warm sandboxes")
        yield url
    finally:
        if process.poll() is None:
            stop_local_serve(process, log)


def test_schemathesis_with_every_check_finds_nothing(fuzz_gateway: str, tmp_path: Path) -> None:
    config = config_file(tmp_path)
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(config),
            "run", f"{fuzz_gateway}/openapi.json",
            "--header", f"Authorization: Bearer {TOKENS['tenant-a']}",
            "--checks", "all", "--exclude-checks", EXCLUDED_CHECKS,
            # Every phase, stateful included (it follows pools -> acquire -> lease routes), in a
            # bounded time; one worker (hypothesis's AST use is not thread-safe on CPython 3.11).
            "--max-time", str(FUZZ_SECONDS), "--workers", "1", "--request-timeout", "30",
            "--generation-deterministic",
        ],
        capture_output=True, text=True, timeout=FUZZ_SECONDS + 120, cwd=tmp_path,
    )  # fmt: skip
    failures = result.stdout[result.stdout.find("FAILURES") :]
    assert result.returncode == 0, failures[:12000]
    assert "Stateful" in result.stdout
    assert " passed" in result.stdout
