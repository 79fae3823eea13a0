"""The Python client and CLI against a real gateway, and the data plane to a real agent process.

The sandbox Pod's address is pointed at an agent on loopback, so exec, files and the client's
context managers are exercised end to end through the Kubernetes gateway (gVisor itself is
covered by the local-runtime and real-node suites).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from sandfleet.client import AsyncFleet, Fleet, LeaseEnded, NoSandboxInTime, Unauthorized
from sandfleet.core import api
from tests.integration.gateway.conftest import Gateway, GatewayFactory, Pool, loopback_sandbox

pytestmark = pytest.mark.cluster


def test_sync_client_execs_and_moves_files_through_the_gateway(
    pool: Pool, start_gateway: GatewayFactory, agent: int
) -> None:
    loopback_sandbox(pool, agent)
    gateway = start_gateway()
    with Fleet(gateway.url, token="actor-token") as fleet, fleet.lease("python") as sandbox:
        result = sandbox.exec(["sh", "-c", "echo $EPISODE; exit 3"], env={"EPISODE": "7"})
        assert result.exit_code == 3
        assert result.stdout == "7\n"
        sandbox.write_file("notes/a.txt", "hello")
        assert sandbox.read_file("notes/a.txt") == b"hello"
        assert sandbox.exec("cat notes/a.txt").stdout == "hello"
        lease_id = sandbox.lease.id
    with Fleet(gateway.url, token="actor-token") as fleet:
        with pytest.raises(LeaseEnded):
            fleet.renew(lease_id)
        assert pool.states()["python-loop-0"] == api.LEASE_RELEASED


def test_async_client_group_and_errors(pool: Pool, start_gateway: GatewayFactory) -> None:
    pool.add_sandboxes(2)
    gateway = start_gateway()

    async def scenario() -> None:
        async with AsyncFleet(gateway.url, token="actor-token") as fleet:
            async with fleet.group("python", 2, labels={"run": "g"}) as sandboxes:
                assert len({s.lease.sandbox for s in sandboxes}) == 2
                assert len(await fleet.leases(run="g")) == 2
            assert await fleet.leases(run="g") == []
            with pytest.raises(NoSandboxInTime) as waited:
                await fleet.acquire("python", wait_seconds=0.3)
            assert waited.value.body["queue_position"] == 1
        async with AsyncFleet(gateway.url, token="bad") as stranger:
            with pytest.raises(Unauthorized):
                await stranger.pools()

    asyncio.run(scenario())


def test_cli_lease_exec_release(pool: Pool, start_gateway: GatewayFactory, agent: int) -> None:
    loopback_sandbox(pool, agent)
    gateway: Gateway = start_gateway()
    env = dict(os.environ, SANDFLEET_URL=gateway.url, SANDFLEET_TOKEN="actor-token")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sandfleet.cli", *args],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    pools = json.loads(cli("pools", "--json").stdout)
    assert {p["name"] for p in pools} == {"python", "other"}
    leased = cli("lease", "python", "--run", "cli", "--json")
    assert leased.returncode == 0, leased.stderr
    lease_id = json.loads(leased.stdout)[0]["id"]
    ran = cli("exec", lease_id, "--", "sh", "-c", "echo out; echo err >&2; exit 5")
    assert ran.returncode == 5
    assert ran.stdout == "out\n"
    assert ran.stderr == "err\n"
    listed = json.loads(cli("leases", "--run", "cli", "--json").stdout)
    assert [item["id"] for item in listed] == [lease_id]
    assert json.loads(cli("release", lease_id, "--json").stdout) == {lease_id: True}
    gone = cli("exec", lease_id, "--", "true")
    assert gone.returncode == 1
    assert "released" in gone.stderr
    assert "Traceback" not in gone.stderr
    unreachable = subprocess.run(
        [sys.executable, "-m", "sandfleet.cli", "pools", "--url", "http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert unreachable.returncode == 1
    assert "cannot reach the gateway" in unreachable.stderr


def test_cli_bench_measures_lease_exec_release(pool: Pool, start_gateway: GatewayFactory, agent: int) -> None:
    for index in range(4):
        loopback_sandbox(pool, agent, index)
    gateway = start_gateway()
    env = dict(os.environ, SANDFLEET_URL=gateway.url, SANDFLEET_TOKEN="actor-token")
    result = subprocess.run(
        [sys.executable, "-m", "sandfleet.cli", "bench", "python", "--episodes", "4",
         "--concurrency", "2", "--json"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["episodes"] == 4
    for phase in ("lease_ms", "first_exec_ms", "release_ms"):
        assert 0 < report[phase]["p50"] <= report[phase]["p99"]
