"""Hostile use of the data plane through the gateway, on real gVisor sandboxes: the abuser gets a clear
answer and the other leases on the same gateway do not notice.

One `sandfleet serve --local` gateway, two leases: a victim that keeps exec'ing `true` and an
abuser that sends oversized uploads, path traversals, output floods and slow requests. After
each abuse the victim's exec still answers quickly and the gateway is still healthy.
"""

from __future__ import annotations

import asyncio
import io
import statistics
import tarfile
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import pytest

from sandfleet.local.artifacts import ImageRef
from tests.support.servers import start_local_serve, stop_local_serve

pytestmark = pytest.mark.gvisor

TOKEN = {"Authorization": "Bearer local-token"}
T = TypeVar("T")
VICTIM_SLACK_MS = 500  # on top of 4x the victim's own baseline
BASELINES: dict[str, list[float]] = {}


@pytest.fixture(scope="module")
def gateway(runsc: Path, base_image: ImageRef, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `sandfleet serve --local` with 2 warm sandboxes, shared by this module's tests (each
    leases its own); afterwards none of its sandboxes remain.

    Only this gateway's own sandboxes are checked (by its runtime's instance directory): other
    suites may run gVisor sandboxes on the same host at the same time.
    """
    url, process, log = start_local_serve(tmp_path_factory.mktemp("abuse"))
    instance = own_instance(process.pid)
    assert sandboxes_of(instance) >= 1
    yield url
    stop_local_serve(process, log)
    assert sandboxes_of(instance) == 0, "serve left gVisor sandboxes behind"


def own_instance(pid: int) -> str:
    """The runtime instance directory a serve process holds the lock of."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if "/instances/" in target and target.endswith("/lock"):
            return target.removesuffix("/lock")
    raise AssertionError("serve holds no runtime instance lock")


def sandboxes_of(instance: str) -> int:
    """gVisor sandbox processes of one runtime instance."""
    count = 0
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes() if proc.name.isdigit() else b""
        except OSError:
            continue
        if cmdline.startswith(b"runsc-sandbox") and f"--root={instance}/runsc".encode() in cmdline:
            count += 1
    return count


@pytest.fixture
async def client(gateway: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway, headers=TOKEN, timeout=120) as http:
        yield http


async def lease(client: httpx.AsyncClient) -> str:
    response = await client.post(
        "/v1/leases", json={"pool": "python", "wait_seconds": 60, "ttl_seconds": 600}
    )
    assert response.status_code == 201, response.text
    lease_id: str = response.json()["leases"][0]["id"]
    return lease_id


async def victim_execs(client: httpx.AsyncClient, lease_id: str, stop: asyncio.Event) -> list[float]:
    """exec `true` in the victim's sandbox until `stop`; each round trip in ms (all must succeed)."""
    latencies = []
    while not stop.is_set():
        started = time.perf_counter()
        response = await client.post(f"/v1/leases/{lease_id}/exec", json={"argv": ["true"]})
        latencies.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.text
        assert response.json()["exit_code"] == 0
        await asyncio.sleep(0.05)
    return latencies


async def alongside(
    client: httpx.AsyncClient, victim: str, abuse: Coroutine[Any, Any, T]
) -> tuple[T, list[float]]:
    """Run `abuse` (a coroutine) while the victim execs; its result, and the victim's latencies
    first on their own (the baseline, on this machine as loaded as it is now), then alongside."""
    baseline = asyncio.Event()
    baseline_task = asyncio.create_task(victim_execs(client, victim, baseline))
    await asyncio.sleep(1.0)
    baseline.set()
    BASELINES[victim] = await baseline_task
    stop = asyncio.Event()
    victim_task = asyncio.create_task(victim_execs(client, victim, stop))
    await asyncio.sleep(0.2)
    try:
        result = await abuse
    finally:
        await asyncio.sleep(0.3)
        stop.set()
    latencies = await victim_task
    assert latencies, "the victim made no call"
    return result, latencies


def assert_victim_unharmed(victim: str, latencies: list[float]) -> None:
    """Every victim call succeeded (checked as they ran) and the median stayed near its baseline.

    The bound is relative: these suites share 2 cores with whatever else runs, so an absolute
    latency would measure the machine, not the abuse.
    """
    before, during = statistics.median(BASELINES[victim]), statistics.median(latencies)
    assert during < 4 * before + VICTIM_SLACK_MS, f"victim p50 {during:.0f} ms during, {before:.0f} ms before"


async def gateway_healthy(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).status_code == 200
    assert (await client.get("/readyz")).status_code == 200


async def test_oversized_upload_is_refused_or_contained(client: httpx.AsyncClient) -> None:
    victim, abuser = await lease(client), await lease(client)

    async def upload() -> httpx.Response:
        chunk = b"\0" * (1 << 20)

        async def body() -> AsyncIterator[bytes]:
            for _ in range(1536):  # 1.5 GiB, three times the sandbox's memory limit
                yield chunk

        return await client.put(
            f"/v1/leases/{abuser}/files", params={"path": "big.bin"}, content=body(), timeout=600
        )

    response, latencies = await alongside(client, victim, upload())
    # The sandbox's files live in its memory (512 MiB): the upload fills it and the sandbox dies
    # under it. The abuser hears so as a 502 once the stalled write times out, not after an hour.
    assert response.status_code in (413, 502, 507), response.text[:500]
    assert response.headers.get("content-type", "").startswith("application/json"), response.text[:500]
    assert_victim_unharmed(victim, latencies)
    await gateway_healthy(client)


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("GET", {"path": "../../../../etc/passwd"}),
        ("GET", {"path": "/etc/shadow"}),
        ("GET", {"path": "%2e%2e/%2e%2e/etc/passwd"}),
        ("PUT", {"path": "../../../tmp/owned"}),
        ("DELETE", {"path": "../../.."}),
        ("GET", {"path": "escape/etc/passwd"}),
    ],
    ids=["dotdot", "absolute", "encoded", "write-outside", "delete-outside", "symlink"],
)
async def test_path_traversal_is_refused(
    client: httpx.AsyncClient, method: str, params: dict[str, str]
) -> None:
    abuser = await lease(client)
    link = await client.post(f"/v1/leases/{abuser}/exec", json={"shell": "ln -s / escape"})
    assert link.json()["exit_code"] == 0
    response = await client.request(
        method, f"/v1/leases/{abuser}/files", params=params, content=b"x" if method == "PUT" else None
    )
    assert response.status_code in (403, 404), response.text[:500]
    assert b"root:" not in response.content


async def test_tar_upload_cannot_escape_the_workspace(client: httpx.AsyncClient) -> None:
    abuser = await lease(client)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name in ("../../evil.txt", "/etc/evil.txt"):
            info = tarfile.TarInfo(name)
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
    response = await client.put(
        f"/v1/leases/{abuser}/files/archive", params={"path": "."}, content=archive.getvalue()
    )
    assert 400 <= response.status_code < 500, response.text[:500]
    found = await client.post(
        f"/v1/leases/{abuser}/exec", json={"shell": "ls /evil.txt /etc/evil.txt 2>/dev/null | wc -l"}
    )
    assert found.json()["stdout"].strip() == "0"


@pytest.mark.parametrize(
    "lease_path",
    ["..%2F..%2Fv1%2Fpools", "%2e%2e", "x%00y", "a" * 5000],
    ids=["encoded-slashes", "dotdot", "nul", "huge"],
)
async def test_hostile_lease_ids_are_not_found(client: httpx.AsyncClient, lease_path: str) -> None:
    response = await client.post(f"/v1/leases/{lease_path}/exec", json={"argv": ["true"]})
    assert response.status_code in (404, 422), response.text[:500]


async def test_output_flood_is_capped_and_the_gateway_does_not_balloon(
    client: httpx.AsyncClient, gateway: str
) -> None:
    victim, abuser = await lease(client), await lease(client)
    rss_before = gateway_rss(gateway)

    async def floods() -> list[httpx.Response]:
        # 4 at once: each prints 300 MB (1.2 GB in all, six times the RSS growth allowed below);
        # the agent keeps the first MiB of each and says so.
        return list(
            await asyncio.gather(
                *(
                    client.post(
                        f"/v1/leases/{abuser}/exec",
                        json={"shell": "yes flood | head -c 300000000", "timeout_s": 60},
                    )
                    for _ in range(4)
                )
            )
        )

    responses, latencies = await alongside(client, victim, floods())
    for response in responses:
        assert response.status_code == 200, response.text[:500]
        body = response.json()
        assert body["stdout_truncated"] is True
        assert len(body["stdout"]) <= 1 << 20
    assert_victim_unharmed(victim, latencies)
    assert gateway_rss(gateway) - rss_before < 200, "the gateway buffered a flood"


async def abandon_a_streamed_flood(
    client: httpx.AsyncClient, gateway: str, max_output_bytes: int | None
) -> None:
    victim, abuser = await lease(client), await lease(client)
    body: dict[str, Any] = {"shell": "yes flood", "timeout_s": 120}
    if max_output_bytes is not None:
        body["max_output_bytes"] = max_output_bytes

    async def read_a_little_then_vanish() -> int:
        got = 0
        async with client.stream("POST", f"/v1/leases/{abuser}/exec/stream", json=body) as response:
            assert response.status_code == 200
            async for chunk in response.aiter_bytes():
                got += len(chunk)
                if got > 512 << 10:
                    break  # the client goes away mid-stream
        return got

    got, latencies = await alongside(client, victim, read_a_little_then_vanish())
    assert got > 512 << 10
    assert_victim_unharmed(victim, latencies)
    # The abandoned `yes` must not keep running in the abuser's sandbox (its timeout is 120 s).
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        ps = await client.post(
            f"/v1/leases/{abuser}/exec", json={"shell": "ps -eo comm | grep -c '^yes$' || true"}
        )
        if ps.json()["stdout"].strip() == "0":
            return
        await asyncio.sleep(1)
    pytest.fail("the streamed command kept running after its client went away")


async def test_streamed_flood_abandoned_by_its_client_is_killed(
    client: httpx.AsyncClient, gateway: str
) -> None:
    # The gateway closes its connection to the agent when the caller goes away; the agent's next
    # write fails and it kills the process group.
    await abandon_a_streamed_flood(client, gateway, max_output_bytes=256 << 20)


async def test_streamed_flood_past_the_output_cap_abandoned_by_its_client_is_killed(
    client: httpx.AsyncClient, gateway: str
) -> None:
    await abandon_a_streamed_flood(client, gateway, max_output_bytes=None)


async def test_slow_clients_do_not_starve_others(client: httpx.AsyncClient, gateway: str) -> None:
    victim, abuser = await lease(client), await lease(client)
    address = urlsplit(gateway)
    host, port = address.hostname or "127.0.0.1", address.port or 80

    async def slowloris(count: int, seconds: float) -> int:
        """`count` connections that send a request a few bytes at a time and never finish it."""
        writers = []
        for _ in range(count):
            _, writer = await asyncio.open_connection(host, port)
            writer.write(b"POST /v1/leases/" + abuser.encode() + b"/exec HTTP/1.1\r\nHost: x\r\n")
            writers.append(writer)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for writer in writers:
                writer.write(b"X-a: b\r\n")
            await asyncio.sleep(0.5)
        for writer in writers:
            writer.close()
        return count

    async def slow_body(seconds: float) -> int:
        """One upload that trickles a byte every 100 ms."""

        async def body() -> AsyncIterator[bytes]:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                yield b"x"
                await asyncio.sleep(0.1)

        response = await client.put(f"/v1/leases/{abuser}/files", params={"path": "slow.txt"}, content=body())
        return response.status_code

    async def both() -> tuple[int, int]:
        opened, status = await asyncio.gather(slowloris(200, 8), slow_body(8))
        return opened, status

    result, latencies = await alongside(client, victim, both())
    assert result == (200, 200)
    assert_victim_unharmed(victim, latencies)
    await gateway_healthy(client)


def gateway_rss(gateway: str) -> float:
    """The serve process's RSS in MiB, found by the port it listens on."""
    port = urlsplit(gateway).port
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state = fields[1], fields[3]
        if state == "0A" and int(local.split(":")[1], 16) == port:
            inode = fields[9]
    assert inode is not None, "no listener on the gateway's port"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if fd.readlink().as_posix() == f"socket:[{inode}]":
                    for status in (proc / "status").read_text().splitlines():
                        if status.startswith("VmRSS:"):
                            return int(status.split()[1]) / 1024
        except OSError:
            continue
    raise AssertionError("the gateway process was not found")
