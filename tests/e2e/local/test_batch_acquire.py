"""A step's batch over `sandfleet serve --local` and real gVisor: the client's batch and the CLI's --min."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandfleet.client import AsyncFleet, LeaseEnded, SandfleetError
from sandfleet.local.artifacts import ImageRef
from tests.support.servers import start_local_serve, stop_local_serve

pytestmark = pytest.mark.gvisor


@pytest.fixture
def gateway(runsc: Path, base_image: ImageRef, tmp_path: Path) -> Iterator[str]:
    """`serve --local` with 2 warm sandboxes; its sandboxes are all gone once it stops."""
    url, process, log = start_local_serve(tmp_path)
    yield url
    stop_local_serve(process, log)  # and none of its sandboxes left


def test_a_batch_leases_distinct_gvisor_sandboxes_and_releases_them_all(gateway: str) -> None:
    async def scenario() -> None:
        async with AsyncFleet(gateway, token="local-token") as fleet:
            # 2 warm; the rest are booted on demand while the batch waits (or it takes what it has).
            async with fleet.batch("python", 4, min_count=2, wait_seconds=5, labels={"run": "b"}) as step:
                assert 2 <= len(step) <= 4
                assert len({sandbox.lease.sandbox for sandbox in step}) == len(step)
                outs = await asyncio.gather(
                    *(
                        s.exec(["sh", "-c", "dmesg | head -1; echo $N"], env={"N": str(i)})
                        for i, s in enumerate(step)
                    )
                )
                assert all("gVisor" in out.stdout for out in outs)
                assert [out.stdout.split()[-1] for out in outs] == [str(i) for i in range(len(step))]
                ids = [sandbox.lease.id for sandbox in step]
            for lease_id in ids:  # every one released on the way out
                with pytest.raises(LeaseEnded):
                    await fleet.renew(lease_id)
            with pytest.raises(SandfleetError, match="min_count to at most 64") as refused:
                await fleet.acquire("python", count=100, min_count=65, wait_seconds=30)
            assert (refused.value.status, refused.value.code) == (422, "batch_too_large")

    asyncio.run(scenario())


def test_the_cli_leases_a_batch_and_prints_one_id_a_line(gateway: str) -> None:
    leased = subprocess.run(
        [sys.executable, "-m", "sandfleet.cli", "lease", "python", "--count", "3", "--min", "1",
         "--wait", "2", "--run", "cli-batch", "--url", gateway, "--token", "local-token"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert leased.returncode == 0, leased.stderr
    ids = leased.stdout.split()
    assert 1 <= len(ids) <= 3
    assert all(lease_id.startswith("local.") for lease_id in ids)

    async def release() -> list[str]:
        async with AsyncFleet(gateway, token="local-token") as fleet:
            return await fleet.release_run("cli-batch")

    assert sorted(asyncio.run(release())) == sorted(ids)
