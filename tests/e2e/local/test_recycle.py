"""Recycling in place over real gVisor: a run's sandbox is reset from its golden checkpoint and probed.

An episode leaves a file, a background process and a listening socket; the run's next lease gets
the same runsc sandbox with none of them and a token of its own; another run never gets it; the
K-th episode's sandbox is destroyed; a reset that fails destroys the sandbox, never hands it out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sandfleet.client import Fleet, LeaseEnded
from sandfleet.core.agent_tokens import agent_token
from sandfleet.core.model import image_key
from sandfleet.core.recycle import Fingerprint, RecyclePolicy, fingerprint_from_json, probe_problems
from sandfleet.gateway.lease_requests import LeaseRequest
from sandfleet.gateway.leasing import LeaseService
from sandfleet.gateway.local import LocalBackend
from sandfleet.local.artifacts import ImageRef
from sandfleet.local.runtime import LocalRuntime, RunscSandbox, SandboxSpec
from tests.e2e.local.conftest import host_debris, sh
from tests.support.servers import start_local_serve, stop_local_serve

pytestmark = pytest.mark.gvisor

K = 3
LISTENER = "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 9000)); s.listen(); time.sleep(1000)"


class Recycling:
    """A recycling LocalBackend over a real runtime, its lease service, and every runsc sandbox seen."""

    def __init__(self, runtime: LocalRuntime, backend: LocalBackend) -> None:
        self.runtime = runtime
        self.backend = backend
        self.service = LeaseService(backend)
        self.seen: dict[str, RunscSandbox] = {}
        self.leased_now: set[str] = set()  # runsc ids under a live lease: never two leases at once

    async def lease(self, run: str | None, holder: str = "me") -> tuple[str, RunscSandbox]:
        labels = {"run": run} if run else {}
        request = LeaseRequest(pool="local", holder=holder, labels=labels, wait_seconds=60)
        ((lease, _),) = (await self.service.acquire(request)).leases
        local = self.backend._local[lease.id]
        assert local.id not in self.leased_now, f"{local.id} leased twice"
        self.leased_now.add(local.id)
        self.seen[local.id] = local
        return lease.id, local

    async def release(self, lease_id: str, local: RunscSandbox) -> None:
        self.leased_now.discard(local.id)
        assert await self.service.release(lease_id, "me")

    def agent(self, lease_id: str, local: RunscSandbox) -> httpx.AsyncClient:
        # The token the gateway's proxy sends for this lease: derived from the lease's sandbox name.
        name = lease_id.removeprefix("local.")
        token = agent_token(self.runtime.fleet_key, name)
        return httpx.AsyncClient(
            base_url=local.url, headers={"Authorization": f"Bearer {token}"}, timeout=60, trust_env=False
        )

    def resets(self, result: str) -> float:
        return sum(
            sample.value
            for metric in self.backend.resets.collect()
            for sample in metric.samples
            if sample.name.endswith("_total") and sample.labels == {"pool": "local", "result": result}
        )

    async def until_resets(self, result: str, count: int) -> None:
        for _ in range(600):
            if self.resets(result) >= count:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"never {count} resets with result {result}")


@pytest.fixture
async def recycling(runsc: Path, base_image: ImageRef) -> AsyncIterator[Recycling]:
    runtime = LocalRuntime(base_image, runsc)
    policy = RecyclePolicy(max_episodes=K, max_seconds=600)
    backend = LocalBackend(runtime, "local", [base_image], warm=2, recycle=policy)
    await backend.start()
    fleet = Recycling(runtime, backend)
    for _ in range(1500):
        if len(backend.warm("local", image_key(base_image.tag))) == 2:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("the recycling pool never had 2 warm sandboxes")
    yield fleet
    await backend.stop()
    assert host_debris(runtime, list(fleet.seen.values())) == {}, "a recycled sandbox leaked"


async def test_a_run_s_sandbox_comes_back_clean_with_a_new_token_and_only_for_that_run(
    recycling: Recycling,
) -> None:
    fleet = recycling
    lease_id, first = await fleet.lease("r1")
    first_id, first_address = first.id, first.address
    async with fleet.agent(lease_id, first) as agent:
        await sh(agent, "echo episode > /workspace/marker && echo episode > /tmp/marker")
        assert (await agent.post("/v1/jobs", json={"argv": ["sleep", "1000"]})).status_code == 201
        assert (await agent.post("/v1/jobs", json={"argv": ["python3", "-c", LISTENER]})).status_code == 201
        for _ in range(100):
            if ":2328 " in (await sh(agent, "cat /proc/net/tcp"))["stdout"]:  # listening on 9000
                break
            await asyncio.sleep(0.05)
    # The probe sees everything the episode left: a reset that kept any of it would fail.
    golden = next(iter(fleet.runtime._goldens.values()))
    dirty = probe_problems(golden.fingerprint, await fleet.runtime.probe(first), fleet.runtime.agent_port)
    assert any("sleep 1000" in p for p in dirty)
    assert any("sockets differ" in p and "9000" in p for p in dirty)
    assert any("/workspace differs" in p for p in dirty)
    assert any("/tmp differs" in p for p in dirty)
    old_token = agent_token(fleet.runtime.fleet_key, lease_id.removeprefix("local."))
    await fleet.release(lease_id, first)
    await fleet.until_resets("recycled", 1)

    again_id, again = await fleet.lease("r1")
    assert again.id == first_id  # the same runsc sandbox, reset in place
    assert again_id != lease_id  # under a lease (and a token) of its own
    async with fleet.agent(again_id, again) as agent:
        listing = await sh(agent, "ls -a /workspace /tmp; ps -eo args")
        assert "marker" not in listing["stdout"]
        assert "sleep 1000" not in listing["stdout"]
        assert ":2328 " not in (await sh(agent, "cat /proc/net/tcp /proc/net/tcp6"))["stdout"]
        assert (await agent.get("/v1/jobs")).json()["jobs"] == []
    async with httpx.AsyncClient(timeout=10, trust_env=False) as stranger:
        refused = await stranger.get(f"{again.url}/v1/jobs", headers={"Authorization": f"Bearer {old_token}"})
        assert refused.status_code == 401  # the last episode's token opens nothing
    assert again.address != first_address  # a fresh network namespace: no old connection reaches it

    # Another run, or the same run of another tenant, never gets it while it is held or reset.
    await fleet.release(again_id, again)
    await fleet.until_resets("recycled", 2)
    for run, holder in (("r2", "me"), ("r1", "someone-else")):
        other_id, other = await fleet.lease(run, holder)
        assert other.id != first_id
        fleet.leased_now.discard(other.id)
        assert await fleet.service.release(other_id, holder)

    # Episode K of r1 is the sandbox's last: it is destroyed, and episode K + 1 gets another.
    third_id, third = await fleet.lease("r1")
    assert third.id == first_id
    await fleet.release(third_id, third)
    for _ in range(300):
        if first_id not in fleet.runtime.sandboxes:
            break
        await asyncio.sleep(0.02)
    assert first_id not in fleet.runtime.sandboxes
    fourth_id, fourth = await fleet.lease("r1")
    assert fourth.id != first_id
    await fleet.release(fourth_id, fourth)


async def test_each_restored_sandbox_has_its_own_token_and_the_golden_s_opens_none(
    recycling: Recycling,
) -> None:
    warm = recycling.backend.warm("local", image_key(recycling.runtime.image.tag)).sandboxes()
    one, two = (recycling.backend._local[s.key] for s in warm)
    assert "runsc_restore_s" in one.timings  # restored from the golden checkpoint, not booted
    golden = next(iter(recycling.runtime._goldens.values()))
    async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
        for mine, other in ((one, two), (two, one)):
            assert (await client.get(f"{mine.url}/v1/jobs", headers=mine.headers)).status_code == 200
            assert (await client.get(f"{other.url}/v1/jobs", headers=mine.headers)).status_code == 401
            golden_headers = {"Authorization": f"Bearer {golden.snapshot.token}"}
            assert (await client.get(f"{mine.url}/v1/jobs", headers=golden_headers)).status_code == 401
            rekey = await client.post(
                f"{mine.url}/v1/rekey", json={"token": "x" * 40}, headers=golden_headers
            )
            assert rekey.status_code == 401  # nobody holding the golden token can take one over


async def test_a_reset_that_fails_destroys_the_sandbox_and_the_next_lease_gets_a_fresh_one(
    recycling: Recycling,
) -> None:
    fleet = recycling
    lease_id, first = await fleet.lease("r1")
    await fleet.backend.warm_pool.wait_full()  # no restore in flight that could retake the golden
    # Corrupt the golden checkpoint the reset restores from.
    golden = next(iter(fleet.runtime._goldens.values()))
    images = [p for p in golden.snapshot.path.iterdir() if p.is_file()]
    assert images
    for image in images:
        image.write_bytes(b"corrupt")
    await fleet.release(lease_id, first)
    await fleet.until_resets("restore_failed", 1)
    assert first.id not in fleet.runtime.sandboxes  # destroyed, never warm again
    assert fleet.resets("recycled") == 0
    again_id, again = await fleet.lease("r1")
    assert again.id != first.id
    async with fleet.agent(again_id, again) as agent:
        assert (await sh(agent, "ls /workspace"))["stdout"] == ""
    await fleet.release(again_id, again)


def test_through_serve_local_the_run_s_next_lease_is_the_reset_sandbox(
    runsc: Path, base_image: ImageRef, tmp_path: Path
) -> None:
    url, process, log = start_local_serve(tmp_path, extra_args=["--recycle-episodes", "3"])
    try:
        with Fleet(url, token="local-token") as fleet:
            with fleet.lease("python", labels={"run": "r1"}, wait_seconds=60) as sandbox:
                sandbox.write_file("marker.txt", "episode 1")
                assert sandbox.exec(["cat", "marker.txt"]).stdout == "episode 1"
                first = sandbox.lease.id
            for _ in range(300):
                if _sample(url, "sandfleet_sandbox_resets_total", result="recycled") == 1:
                    break
                time.sleep(0.05)
            else:
                raise AssertionError("the released sandbox was never reset")
            booted = _sample(url, "sandfleet_sandbox_startup_seconds_count", phase="total")
            with fleet.lease("python", labels={"run": "r1"}, wait_seconds=60) as sandbox:
                assert sandbox.lease.id != first
                # The reset sandbox serves it: no warm one was taken, so none is booted to refill
                # (had a warm one served it, a refill would be ready within a second or two).
                time.sleep(3)
                assert _sample(url, "sandfleet_sandbox_startup_seconds_count", phase="total") == booted
                # Through the gateway's proxy, with the token of the new lease's name.
                listing = sandbox.exec(["ls", "-a", "/workspace"])
                assert listing.ok
                assert "marker.txt" not in listing.stdout
            with pytest.raises(LeaseEnded):
                fleet.renew(first)  # the last episode's lease id never reaches the next episode
    finally:
        # Its sandboxes are torn down with it (no leak: the in-process tests above check the host).
        stop_local_serve(process, log)


def _sample(url: str, name: str, **labels: str) -> float:
    """One sample of the server's /metrics, by name and labels (0 when it is not exported)."""
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


AGENT_RESET_ROOTS = [
    "/workspace",
    "/tmp",
    "/var/tmp",
    "/home",
    "/root",
    "/dev/shm",
    "/logs",
    "/tests",
    "/solution",
]


async def test_the_agent_s_own_reset_ends_the_episode_s_processes_and_files(runtime: LocalRuntime) -> None:
    """The Kubernetes path's reset (no checkpoint through a kubelet), proven in a local sandbox."""
    sandbox = await runtime.create(
        SandboxSpec(env={"SANDFLEET_AGENT_PRISTINE_DIR": "/var/lib/sandfleet-pristine"})
    )
    async with httpx.AsyncClient(
        base_url=sandbox.url, headers=sandbox.headers, timeout=60, trust_env=False
    ) as agent:

        async def fingerprint() -> Fingerprint:
            answer = await agent.post("/v1/probe", json={"roots": AGENT_RESET_ROOTS})
            return fingerprint_from_json(answer.json())

        clean = await fingerprint()
        await sh(
            agent,
            "echo x > /workspace/marker && mkdir -p ~/.cache && echo y > ~/.cache/z && ln -s /etc /tmp/l",
        )
        await sh(agent, "mkfifo /tmp/fifo")
        assert (await agent.post("/v1/jobs", json={"argv": ["python3", "-c", LISTENER]})).status_code == 201
        await sh(agent, "nohup sleep 1000 > /dev/null 2>&1 &")
        assert probe_problems(clean, await fingerprint(), runtime.agent_port)
        # The sandbox user cannot read the pristine copy (only root can).
        peek = await sh(agent, "ls /var/lib/sandfleet-pristine")
        assert peek["exit_code"] != 0
        reset = await agent.post("/v1/reset", json={"episode": 1})
        assert reset.status_code == 200, reset.text
        assert probe_problems(clean, await fingerprint(), runtime.agent_port) == []
        # The reset's own answer carries its probe and the agent's golden one, and they agree.
        golden, seen = (fingerprint_from_json(reset.json()[k]) for k in ("golden", "probe"))
        assert probe_problems(golden, seen, runtime.agent_port) == []
        # A call of the ended episode (no episode header is episode 0) never reaches the next one.
        stale = await agent.post("/v1/exec", json={"argv": ["touch", "/workspace/late"]})
        assert stale.status_code == 410
        assert stale.json()["error"]["code"] == "episode_ended"
        again = await agent.post("/v1/reset", json={"episode": 1})
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "episode_already_reset"
        agent.headers["X-Sandfleet-Episode"] = "1"
        assert (await sh(agent, "ls -a /workspace /tmp"))["stdout"].count("marker") == 0
        assert (await agent.get("/v1/jobs")).json()["jobs"] == []
