"""schemathesis over the gateway's whole OpenAPI: no 5xx, and every status it answers is documented."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.gateway.conftest import GatewayFactory, Pool
from tests.integration.gateway.test_client_and_data_plane import agent, loopback_sandbox

pytestmark = pytest.mark.cluster
__all__ = ["agent"]  # the fixture, imported for this module's tests


def test_schemathesis_finds_no_server_errors_or_undocumented_statuses(
    pool: Pool, start_gateway: GatewayFactory, agent: int, tmp_path: Path
) -> None:
    # The only sandbox points at a loopback agent, so no generated call leaves this machine;
    # a queue of 0 answers 429 at once instead of letting generated waits of minutes block.
    loopback_sandbox(pool, agent)
    gateway = start_gateway(max_waiting=0)
    report = tmp_path / "junit.xml"
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("schemathesis")), "run", f"{gateway.url}/openapi.json",
            "--checks", "not_a_server_error,status_code_conformance,content_type_conformance",
            "--header", "Authorization: Bearer actor-token",
            # One worker: the AST parsing hypothesis does to describe strategies is not thread-safe
            # on CPython 3.11 ("AST constructor recursion depth mismatch").
            "--max-examples", "30", "--request-timeout", "30", "--workers", "1",
            "--generation-deterministic", "--report", "junit", "--report-junit-path", str(report),
        ],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,  # it writes .schemathesis/
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:]
    assert "passed" in result.stdout
