"""The learner's endpoint and the actor's client for it, in process (ASGI), plus retries."""

from __future__ import annotations

import asyncio
from typing import cast

import httpx
import pytest

from sandfleet.client import AsyncFleet
from sandfleet.rl.catalogue_tasks import load_tasks
from sandfleet.rl.loop import Learner, LoopConfig, LoopStats
from sandfleet.rl.policy import SoftmaxPolicy, Trajectory
from sandfleet.rl.service import learner_app
from sandfleet.rl.transport import LearnerClient, LearnerUnavailable
from tests.unit.rl.fakes import FakeFleet

TASK = load_tasks()[0]  # the default catalogue's (tasks/ci.yaml)


@pytest.fixture
async def learner() -> Learner:
    started = Learner(cast(AsyncFleet, FakeFleet()), LoopConfig(run="r", batch_size=2), LoopStats())
    await started.start()
    return started


def client_for(learner: Learner, retries: int = 0) -> LearnerClient:
    transport = httpx.ASGITransport(app=learner_app(learner))
    return LearnerClient("http://learner", retries=retries, transport=transport)


def right(version: int = 0) -> Trajectory:
    return Trajectory(TASK.id, TASK.correct_choice, -0.693, 1.0, version, "a0")


async def test_trajectories_in_weights_out(learner: Learner) -> None:
    stop = asyncio.Event()
    training = asyncio.create_task(learner.run(stop))
    async with client_for(learner) as link:
        first = await link.weights()
        assert first.version == 0
        assert await link.weights() is first  # nothing newer: a 204, the cached copy
        assert link.fetches == 1
        assert await link.send_many([right(), right()]) == 2
        for _ in range(100):
            if learner.weights().version >= 1:
                break
            await asyncio.sleep(0.02)
        newer = await link.weights()
        assert newer.version == 1
        assert link.fetches == 2
        assert (
            newer.probabilities(TASK.id)[TASK.correct_choice]
            > first.probabilities(TASK.id)[TASK.correct_choice]
        )
        stats = await link.stats()
        assert stats["received"] == 2
        assert stats["by_actor"] == {"a0": 2}
        assert stats["version"] == 1
    stop.set()
    await training


async def test_bad_trajectories_are_422(learner: Learner) -> None:
    transport = httpx.ASGITransport(app=learner_app(learner))
    async with httpx.AsyncClient(transport=transport, base_url="http://learner") as http:
        good = right().to_json()
        for bad in (
            {**good, "action": len(TASK.choices)},
            {**good, "task": "nope"},
            {**good, "behaviour_logp": 0.5},
        ):
            response = await http.post("/v1/trajectories", json={"trajectories": [bad]})
            assert response.status_code == 422, bad
        assert (await http.post("/v1/trajectories", json={"trajectories": []})).status_code == 422
    assert learner.received == 0


async def test_a_stopping_learner_answers_503_and_the_client_says_so(learner: Learner) -> None:
    learner.closed = True
    async with client_for(learner) as link:
        with pytest.raises(LearnerUnavailable, match="503"):
            await link.send(right())
    transport = httpx.ASGITransport(app=learner_app(learner))
    async with httpx.AsyncClient(transport=transport, base_url="http://learner") as http:
        assert (await http.get("/readyz")).status_code == 503
        assert (await http.get("/healthz")).status_code == 200


async def test_the_client_retries_a_learner_that_is_not_up_yet() -> None:
    calls = 0
    weights = SoftmaxPolicy({TASK.id: len(TASK.choices)})

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json=weights.to_json())

    async with LearnerClient("http://learner", retries=3, transport=httpx.MockTransport(handler)) as link:
        assert (await link.weights()).version == 0
    assert calls == 3
    async with LearnerClient("http://learner", retries=1, transport=httpx.MockTransport(handler)) as link:
        calls = 0
        with pytest.raises(LearnerUnavailable, match="ConnectError"):
            await link.weights()


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The back-off waits slept (each a moment's yield instead)."""
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    return slept


async def test_a_busy_learner_is_asked_again_after_growing_waits(waits: list[float]) -> None:
    statuses = iter([503, 429, 204])
    transport = httpx.MockTransport(lambda request: httpx.Response(next(statuses)))
    async with LearnerClient("http://learner", retries=5, transport=transport) as link:
        assert (await link._request("GET", "/v1/weights")).status_code == 204
    assert waits == [0.4, 0.8]

    waits.clear()
    calls: list[str] = []

    def busy(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return httpx.Response(503, text="restarting")

    async with LearnerClient("http://learner", retries=5, transport=httpx.MockTransport(busy)) as link:
        with pytest.raises(
            LearnerUnavailable, match=r"did not take POST /v1/trajectories: HTTP 503: restarting"
        ):
            await link.send_many([right()])
    assert len(calls) == 6
    assert waits == [0.4, 0.8, 1.6, 3.0, 3.0]  # doubling, at most 3 s, none after the last try


async def test_a_learner_that_refuses_is_not_asked_again(waits: list[float]) -> None:
    calls: list[str] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return httpx.Response(422, text="bad trajectory")

    async with LearnerClient("http://learner", retries=5, transport=httpx.MockTransport(refuse)) as link:
        with pytest.raises(LearnerUnavailable, match=r"refused POST /v1/trajectories: Client error '422"):
            await link.send_many([right()])
    assert calls == ["/v1/trajectories"]
    assert waits == []


def test_weights_and_trajectories_round_trip_through_json() -> None:
    policy = SoftmaxPolicy({"a": 3, "b": 2})
    policy.logits["a"][1] = 2.5
    policy.version = 9
    back = SoftmaxPolicy.from_json(policy.to_json())
    assert back.version == 9
    assert back.probabilities("a") == pytest.approx(policy.probabilities("a"))
    with pytest.raises(ValueError, match="finite"):
        SoftmaxPolicy.from_json({"version": 1, "logits": {"a": [float("nan")]}})
    assert Trajectory.from_json(right(3).to_json()) == right(3)
