"""Runs in the gateway: policy publishing and staleness on acquire, spans and the profile, over HTTP."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from sandfleet.core.policy_versions import publish
from sandfleet.gateway.app import Runtime, create_app
from sandfleet.gateway.auth import Authenticator
from sandfleet.gateway.metrics import GatewayMetrics
from sandfleet.gateway.runs import MemoryPolicyStore, Runs
from tests.support.backends import MemoryBackend


async def noop() -> None:
    return None


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, MemoryBackend]]:
    backend = MemoryBackend()
    for i in range(4):
        backend.add(f"s{i}")
    runtime = Runtime(
        backend=backend,
        authenticator=Authenticator(static_tokens={}, anonymous_allowed=True),
        ready=lambda: True,
        start=noop,
        stop=noop,
        policy_store=MemoryPolicyStore(tmp_path / "policies.json"),
    )
    transport = httpx.ASGITransport(app=create_app(runtime))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        yield client, backend


async def acquire(client: httpx.AsyncClient, version: int | None, run: str = "r1") -> httpx.Response:
    body: dict[str, object] = {"pool": "python", "labels": {"run": run}, "wait_seconds": 1}
    if version is not None:
        body["policy_version"] = version
    return await client.post("/v1/leases", json=body)


async def test_stale_acquire_is_refused_with_409_and_a_clear_detail(
    gateway: tuple[httpx.AsyncClient, MemoryBackend],
) -> None:
    client, _ = gateway
    published = await client.post("/v1/runs/r1/policy", json={"version": 10, "staleness_bound": 2})
    assert published.status_code == 200
    assert published.json()["mode"] == "refuse"
    assert (await acquire(client, 8)).status_code == 201
    refused = await acquire(client, 7)
    assert refused.status_code == 409
    assert refused.json()["error"] == "policy_stale"
    assert "3 versions behind" in refused.json()["detail"]
    assert (await acquire(client, 7, run="other-run")).status_code == 201  # bounds are per run
    assert (await acquire(client, None)).status_code == 201  # no version given: not policy-aware
    metrics = (await client.get("/metrics")).text
    assert 'sandfleet_policy_stale_episodes_total{result="refused"} 1.0' in metrics


async def test_flag_mode_leases_and_labels_the_stale_episode(
    gateway: tuple[httpx.AsyncClient, MemoryBackend],
) -> None:
    client, _ = gateway
    await client.post("/v1/runs/r1/policy", json={"version": 5, "staleness_bound": 1, "mode": "flag"})
    response = await acquire(client, 1)
    assert response.status_code == 201
    assert response.json()["leases"][0]["labels"]["policy-stale"] == "4"


async def test_versions_never_go_backwards_and_policy_is_readable(
    gateway: tuple[httpx.AsyncClient, MemoryBackend], tmp_path: Path
) -> None:
    client, _ = gateway
    assert (await client.get("/v1/runs/r1/policy")).status_code == 404
    await client.post("/v1/runs/r1/policy", json={"version": 3})
    backwards = await client.post("/v1/runs/r1/policy", json={"version": 2})
    assert backwards.status_code == 409
    assert backwards.json()["error"] == "policy_conflict"
    assert (await client.get("/v1/runs/r1/policy")).json()["version"] == 3
    assert json.loads((tmp_path / "policies.json").read_text())["r1"]["version"] == 3


async def test_staleness_of_completed_episodes_is_observed_on_release(
    gateway: tuple[httpx.AsyncClient, MemoryBackend],
) -> None:
    client, _ = gateway
    await client.post("/v1/runs/r1/policy", json={"version": 1, "staleness_bound": 5})
    lease = (await acquire(client, 1)).json()["leases"][0]["id"]
    await client.post("/v1/runs/r1/policy", json={"version": 4})
    assert (await client.delete(f"/v1/leases/{lease}")).json()["released"]
    metrics = (await client.get("/metrics")).text
    assert "sandfleet_policy_staleness_versions_sum 3.0" in metrics


async def test_spans_and_profile(gateway: tuple[httpx.AsyncClient, MemoryBackend]) -> None:
    client, _ = gateway
    import time

    now = time.time()
    spans = [{"phase": "generate", "start": now - 10 + i, "end": now - 9.5 + i} for i in range(5)]
    spans += [{"phase": "sandbox_wait", "start": now - 10 + i, "end": now - 9 + i} for i in range(5)]
    spans += [{"phase": "train", "start": now - 5, "end": now - 4, "source": "learner"}]
    recorded = await client.post("/v1/runs/r1/spans", json={"spans": spans, "dropped_stale": 2})
    assert recorded.json() == {"run": "r1", "recorded": 11}
    await acquire(client, None)  # the gateway adds its own queue and claim spans
    profile = (await client.get("/v1/runs/r1/profile", params={"window_seconds": 60})).json()
    phases = {p["phase"]: p for p in profile["phases"]}
    assert phases["generate"]["count"] == 5
    assert phases["generate"]["p50_seconds"] == pytest.approx(0.5)
    assert {"queue", "claim"} <= set(phases)
    assert profile["verdict"]["bottleneck"] == "rollout-sandbox"
    metrics = (await client.get("/metrics")).text
    assert 'sandfleet_loop_phase_seconds_count{phase="generate",run="r1"} 5.0' in metrics
    assert 'sandfleet_policy_stale_episodes_total{result="dropped"} 2.0' in metrics


@pytest.mark.parametrize(
    "span",
    [
        {"phase": "nap", "start": 1, "end": 2},
        {"phase": "exec", "start": 2, "end": 1},
        {"phase": "exec", "start": -1, "end": 1},
        {"phase": "exec", "start": 1, "end": 2, "source": "gateway"},
    ],
)
async def test_bad_spans_are_422_not_500(
    gateway: tuple[httpx.AsyncClient, MemoryBackend], span: object
) -> None:
    client, _ = gateway
    response = await client.post("/v1/runs/r1/spans", json={"spans": [span]})
    assert response.status_code == 422
    assert response.json()["detail"]


async def test_runs_track_idle_time_between_execs() -> None:
    clock = [100.0]
    runs = Runs(MemoryPolicyStore(), GatewayMetrics(), clock=lambda: clock[0])
    from sandfleet.core.leases import LeaseRecord

    runs.leased([LeaseRecord("l1", "python", "a", 100.0, 200.0, 100, {"run": "r"})], 0.5, 0.01)
    runs.exec_done("l1", 102.0, 1.0)  # 2 s of generation, then 1 s of exec
    runs.exec_done("l1", 106.0, 0.5)  # 3 s of generation
    runs.exec_done("l1", 107.0, 2.0, "score")  # the tests, through evaluate
    runs.exec_done("unknown", 106.0, 0.5)  # leases without a run are not tracked
    clock[0] = 110.0
    result = runs.profile("r", 60)
    phases = {p.phase: p for p in result.phases}
    assert phases["idle"].total_seconds == pytest.approx(5.5)
    assert phases["score"].total_seconds == pytest.approx(2.0)
    assert phases["exec"].total_seconds == pytest.approx(1.5)
    assert phases["queue"].total_seconds == pytest.approx(0.5)


async def test_policy_file_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    store = MemoryPolicyStore(path)
    await store.put(publish(None, "r1", 7, now=1.0, staleness_bound=3))
    again = await MemoryPolicyStore(path).get("r1")
    assert again is not None
    assert (again.version, again.staleness_bound) == (7, 3)
    path.write_text("not json")
    assert await MemoryPolicyStore(path).get("r1") is None  # unreadable: logged and ignored
