"""`sandfleet serve --local`: the same client and API over real gVisor sandboxes, no cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandfleet.client import AsyncFleet, Fleet, LeaseEnded
from sandfleet.local.artifacts import ImageRef
from tests.support.servers import runsc_sandboxes, serve_instance, start_local_serve, stop_local_serve

pytestmark = pytest.mark.gvisor


@pytest.fixture
def gateway(runsc: Path, base_image: ImageRef, tmp_path: Path) -> Iterator[str]:
    """A real `sandfleet serve --local` process with 2 warm sandboxes; stopped (and its sandboxes
    destroyed) after the test."""
    url, process, log = start_local_serve(tmp_path)
    instance = serve_instance(process.pid)
    assert instance is not None, "serve holds no runtime instance's lock"
    assert runsc_sandboxes(instance) > 0
    yield url
    stop_local_serve(process, log)  # and none of its sandboxes left


def test_lease_exec_files_release_in_gvisor(gateway: str) -> None:
    with Fleet(gateway, token="local-token") as fleet:
        with fleet.lease("python", labels={"run": "local"}) as sandbox:
            kernel = sandbox.exec(["sh", "-c", "dmesg | head -1"])
            assert "gVisor" in kernel.stdout
            assert sandbox.exec(["id", "-u"]).stdout.strip() != "0"
            sandbox.write_file("a.txt", "hello")
            assert sandbox.read_file("a.txt") == b"hello"
            result = sandbox.exec("echo $EPISODE", env={"EPISODE": "9"})
            assert result.stdout == "9\n"
            lease_id = sandbox.lease.id
        with pytest.raises(LeaseEnded, match="released"):
            fleet.renew(lease_id)
        # The pool refills behind the lease: the next one is warm again.
        again = fleet.acquire("python", wait_seconds=60)[0]
        assert again.id != lease_id
        fleet.release(again.id)


def test_group_and_expiry(gateway: str) -> None:
    async def scenario() -> None:
        async with AsyncFleet(gateway, token="local-token") as fleet:
            async with fleet.group("python", 2, wait_seconds=60) as sandboxes:
                outs = await asyncio.gather(*(s.exec(["hostname"]) for s in sandboxes))
                assert all(o.ok for o in outs)
                assert len({s.lease.sandbox for s in sandboxes}) == 2
            (short,) = await fleet.acquire("python", ttl_seconds=1, wait_seconds=60)
            await asyncio.sleep(2.5)  # the reaper runs every second
            with pytest.raises(LeaseEnded, match="expired"):
                await fleet.renew(short.id)

    asyncio.run(scenario())


def test_unknown_token_and_pool(gateway: str) -> None:
    with httpx.Client(base_url=gateway) as client:
        assert client.get("/v1/pools").status_code == 401
        denied = client.post(
            "/v1/leases", json={"pool": "nope"}, headers={"Authorization": "Bearer local-token"}
        )
        assert denied.status_code == 404
