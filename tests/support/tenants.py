"""A real `sandfleet serve --local` (real gVisor) shared by several tenants, for the security suite."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.servers import start_local_serve, stop_local_serve

# Tenants of the shared gateway. `alice/x` exists to try an idempotency-key collision with `alice`.
TOKENS = {"alice": "alice-token", "bob": "bob-token", "alice/x": "alice-x-token", "ops": "ops-token"}
# Small bounds, so the tests reach them quickly; each is a SANDFLEET_GATEWAY_* setting.
SETTINGS = {
    "SANDFLEET_GATEWAY_RUN_ADMINS": '["ops"]',
    "SANDFLEET_GATEWAY_METRIC_RUNS": "5",
    "SANDFLEET_GATEWAY_HEADER_TIMEOUT_SECONDS": "2",
    "SANDFLEET_GATEWAY_BODY_IDLE_SECONDS": "2",
    "SANDFLEET_GATEWAY_MAX_CONNECTIONS_PER_CLIENT": "40",
}


@dataclass
class TenantGateway:
    """A running gateway and a client per tenant."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def client(self, tenant: str | None, timeout: float = 60) -> httpx.Client:
        headers = {"Authorization": f"Bearer {TOKENS[tenant]}"} if tenant else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout, trust_env=False)

    def rss_kib(self) -> int:
        """The gateway process's resident memory (VmRSS), in KiB."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS in /proc status")


@pytest.fixture(scope="session")
def tenant_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenantGateway]:
    """`sandfleet serve --local` (2 warm sandboxes of pool `python`) with four static-token tenants."""
    if os.geteuid() != 0:
        pytest.fail("the security tests run a real gVisor gateway: they need root")
    directory = tmp_path_factory.mktemp("tenants")
    policies = ["--policy-file", str(directory / "policies.json")]
    url, process, log = start_local_serve(
        directory, TOKENS, settings=SETTINGS, extra_args=policies, timeout=180
    )
    try:
        yield TenantGateway(url, process, log)
    finally:
        if process.poll() is None:
            stop_local_serve(process, log)
