"""A run's profile gathers every replica's spans: two gateway apps, the learner reporting through one."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi import FastAPI

from sandfleet.gateway.app import Runtime, create_app
from sandfleet.gateway.auth import Authenticator, Caller
from sandfleet.gateway.runs import MemoryPolicyStore
from tests.support.backends import MemoryBackend

TOKENS = {"owner": Caller("rl"), "owner-too": Caller("rl"), "stranger": Caller("mallory")}
# Nothing listens on port 1 of the loopback: a replica that went away (connection refused).
GONE = "http://127.0.0.1:1"


async def noop() -> None:
    return None


@dataclass
class Listed:
    """The other replicas, as a listing of the Pods would give them."""

    found: list[str]

    async def addresses(self) -> list[str]:
        return self.found


def gateway(peers: list[str], store: MemoryPolicyStore) -> FastAPI:
    # One store for both, as the ConfigMaps are on Kubernetes: every replica knows a run's owner.
    runtime = Runtime(
        backend=MemoryBackend(),
        authenticator=Authenticator(static_tokens=TOKENS),
        ready=lambda: True,
        start=noop,
        stop=noop,
        peers=Listed(peers),
        policy_store=store,
    )
    return create_app(runtime)


@dataclass
class Replicas:
    front: httpx.AsyncClient  # the replica a reader's connection lands on
    back: httpx.AsyncClient  # the one the learner's connection landed on
    peers: Listed


@pytest.fixture
async def replicas() -> AsyncIterator[Replicas]:
    store = MemoryPolicyStore()
    back = gateway([], store)
    front = gateway(["http://replica-b"], store)
    # The front replica reaches the back one over its own client, as it would over the Pod network.
    front.state.parts.proxy.client = httpx.AsyncClient(
        mounts={"http://replica-b": httpx.ASGITransport(app=back)}
    )
    clients = [
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")
        for app in (front, back)
    ]
    try:
        yield Replicas(clients[0], clients[1], front.state.parts.peers)
    finally:
        for client in clients:
            await client.aclose()
        await front.state.parts.proxy.client.aclose()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def report(client: httpx.AsyncClient, spans: list[dict[str, object]], token: str = "owner") -> None:
    answer = await client.post("/v1/runs/r1/spans", json={"spans": spans}, headers=bearer(token))
    assert answer.status_code == 200, answer.text


def phases(profile: httpx.Response) -> dict[str, int]:
    assert profile.status_code == 200, profile.text
    return {p["phase"]: p["count"] for p in profile.json()["phases"]}


async def test_the_learners_spans_through_one_replica_are_in_the_profile_read_through_another(
    replicas: Replicas,
) -> None:
    now = time.time()
    await report(
        replicas.front, [{"phase": "generate", "start": now - 9 + i, "end": now - 8.5 + i} for i in range(3)]
    )
    train = [
        {"phase": "train", "start": now - 5 + i, "end": now - 4.8 + i, "source": "learner", "worker": "l"}
        for i in range(2)
    ]
    await report(replicas.back, train, token="owner-too")  # the same tenant, another token
    profile = await replicas.front.get(
        "/v1/runs/r1/profile", params={"window_seconds": 60}, headers=bearer("owner")
    )
    assert phases(profile) == {"generate": 3, "train": 2}
    assert profile.json()["learner_busy"] is not None
    assert not [note for note in profile.json()["notes"] if "replicas" in note]
    # The back replica's own share: only what was reported through it, never gathered again.
    held = await replicas.back.get(
        "/v1/runs/r1/spans", params={"window_seconds": 60}, headers=bearer("owner")
    )
    assert held.status_code == 200, held.text
    assert [(s["phase"], s["source"], s["worker"]) for s in held.json()["spans"]] == [
        ("train", "learner", "l")
    ] * 2
    # Outside the window: neither replica counts it.
    old = await replicas.back.get("/v1/runs/r1/spans", params={"window_seconds": 1}, headers=bearer("owner"))
    assert old.json()["spans"] == []


async def test_another_tenant_sees_nothing_of_the_run_on_any_replica(replicas: Replicas) -> None:
    now = time.time()
    await report(replicas.back, [{"phase": "train", "start": now - 2, "end": now - 1, "source": "learner"}])
    for client in (replicas.front, replicas.back):
        for path in ("/v1/runs/r1/profile", "/v1/runs/r1/spans"):
            refused = await client.get(path, headers=bearer("stranger"))
            assert refused.status_code == 403, refused.text
            assert "train" not in refused.text
        assert (await client.get("/v1/runs/r1/spans")).status_code == 401


async def test_a_replica_that_does_not_answer_leaves_a_note_not_an_error(replicas: Replicas) -> None:
    now = time.time()
    await report(replicas.front, [{"phase": "generate", "start": now - 2, "end": now - 1}])
    await report(replicas.back, [{"phase": "train", "start": now - 2, "end": now - 1, "source": "learner"}])
    replicas.peers.found.append(GONE)
    profile = await replicas.front.get("/v1/runs/r1/profile", headers=bearer("owner"))
    assert phases(profile) == {"generate": 1, "train": 1}
    (note,) = [note for note in profile.json()["notes"] if "replicas" in note]
    assert note.startswith("1 of 2 other gateway replicas did not answer")


async def test_a_bad_window_is_422_on_the_spans_route(replicas: Replicas) -> None:
    for window in ("0", "-1", "86401", "soon"):
        answer = await replicas.back.get(
            "/v1/runs/r1/spans", params={"window_seconds": window}, headers=bearer("owner")
        )
        assert answer.status_code == 422, answer.text
