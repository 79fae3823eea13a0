"""A real `sandfleet serve --local` (real gVisor) with small capacity quotas, for the capacity tests."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.kube import wait_until
from tests.support.servers import start_local_serve, stop_local_serve

TOKENS = {"tenant-a": "a-token", "tenant-b": "b-token"}
WARM = 2
LEASE_QUOTA = 3
GROUP_QUOTA = 8
PREFETCH_QUOTA = 100
OVERTAKE_SECONDS = 2.0
POOL_CAPACITY = 64  # the local runtime's cap (sandfleet.gateway.local.MAX_SANDBOXES)
SETTINGS = {
    "SANDFLEET_GATEWAY_MAX_LEASES_PER_TENANT": str(LEASE_QUOTA),
    "SANDFLEET_GATEWAY_MAX_GROUP_SIZE": str(GROUP_QUOTA),
    "SANDFLEET_GATEWAY_MAX_PREFETCH_PER_TENANT": str(PREFETCH_QUOTA),
    "SANDFLEET_GATEWAY_OVERTAKE_SECONDS": str(OVERTAKE_SECONDS),
}


@dataclass
class CapacityGateway:
    """A running gateway, a client per tenant, and the pool's image."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def client(self, tenant: str | None, timeout: float = 60) -> httpx.Client:
        headers = {"Authorization": f"Bearer {TOKENS[tenant]}"} if tenant else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout, trust_env=False)

    def pool(self) -> dict[str, Any]:
        with self.client("tenant-a") as client:
            pools: list[dict[str, Any]] = client.get("/v1/pools").json()["pools"]
        return pools[0]

    def release_all(self) -> None:
        """Every tenant's leases released, and the pool back to its warm target."""
        for tenant in TOKENS:
            with self.client(tenant) as client:
                for lease in client.get("/v1/leases").json()["leases"]:
                    client.delete(f"/v1/leases/{lease['id']}")
        wait_until(lambda: self.pool()["warm"] >= WARM, timeout=120, what=f"{WARM} warm sandboxes again")


@pytest.fixture(scope="session")
def capacity_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CapacityGateway]:
    """`sandfleet serve --local` (pool `python`, 2 warm) with two tenants and small quotas."""
    if os.geteuid() != 0:
        pytest.fail("the capacity tests run a real gVisor gateway: they need root")
    directory = tmp_path_factory.mktemp("capacity")
    policies = ["--policy-file", str(directory / "policies.json")]
    url, process, log = start_local_serve(
        directory, TOKENS, warm=WARM, settings=SETTINGS, extra_args=policies, timeout=180
    )
    try:
        gateway = CapacityGateway(url, process, log)
        wait_until(lambda: gateway.pool()["warm"] >= WARM, timeout=120, what=f"{WARM} warm sandboxes")
        yield gateway
    finally:
        if process.poll() is None:
            stop_local_serve(process, log)


@pytest.fixture
def capacity(capacity_gateway: CapacityGateway) -> Iterator[CapacityGateway]:
    """The shared capacity gateway, with every lease released after the test."""
    yield capacity_gateway
    if capacity_gateway.process.poll() is None:
        capacity_gateway.release_all()


def timed(call: Any, *args: Any, **kwargs: Any) -> tuple[httpx.Response, float]:
    """A request and how long it took, in seconds."""
    started = time.monotonic()
    response = call(*args, **kwargs)
    return response, time.monotonic() - started
