"""The learner as a process: a small HTTP endpoint where actors POST trajectories and GET weights.

    POST /v1/trajectories {"trajectories": [...]}  -> 202 {"accepted": n, "version": v}
                                                      (429 inbox full, 503 shutting down, 422 bad)
    GET  /v1/weights?newer_than=V                  -> 200 {"version": v, "logits": {...}} or 204
    GET  /v1/stats                                 -> what the learner has received and done
    GET  /healthz, /readyz

The gateway still owns leases and policy versions (the learner publishes each version there, and
the gateway refuses stale acquires); experience and weights go straight between the processes.
On SIGTERM the learner stops taking trajectories, trains on what is queued, publishes its last
version to the gateway, and only then closes the endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException, Query, Response
from pydantic import BaseModel, Field

from sandfleet.rl.loop import Learner, LearnerClosed
from sandfleet.rl.policy import Trajectory
from sandfleet.rl.transport import STATS_PATH, TRAJECTORIES_PATH, WEIGHTS_PATH

log = logging.getLogger(__name__)


class TrajectoryIn(BaseModel):
    """One episode as an actor reports it."""

    task: str
    action: int = Field(ge=0)
    behaviour_logp: float = Field(le=0.0)
    reward: float
    policy_version: int = Field(ge=0)
    actor: str = Field("", max_length=253)


class TrajectoriesIn(BaseModel):
    trajectories: list[TrajectoryIn] = Field(min_length=1, max_length=1024)


def learner_app(learner: Learner) -> FastAPI:
    """The endpoint over a started `Learner` (its weights and inbox)."""
    app = FastAPI(title="sandfleet learner", docs_url=None, redoc_url=None)
    actions = {t.id: len(t.choices) for t in learner.config.tasks}

    @app.post(TRAJECTORIES_PATH, status_code=202)
    async def trajectories(body: TrajectoriesIn) -> dict[str, int]:
        for item in body.trajectories:
            if item.action >= actions.get(item.task, 0):
                raise HTTPException(422, f"task {item.task!r} has no action {item.action}")
        accepted = 0
        for item in body.trajectories:
            try:
                learner.submit(Trajectory.from_json(item.model_dump()))
            except LearnerClosed as error:
                status = 503 if learner.closed else 429
                raise HTTPException(status, f"{error}; accepted {accepted} of this batch") from None
            accepted += 1
        return {"accepted": accepted, "version": learner.weights().version}

    @app.get(WEIGHTS_PATH, response_model=None)
    async def weights(newer_than: int = Query(-1)) -> dict[str, Any] | Response:
        published = learner.weights()
        if published.version <= newer_than:
            return Response(status_code=204)  # the actor's copy is current: nothing to transfer
        return published.to_json()

    @app.get(STATS_PATH)
    async def stats() -> dict[str, Any]:
        return learner.summary()

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/readyz")
    async def readyz() -> dict[str, bool]:
        if learner.closed:
            raise HTTPException(503, "the learner is shutting down")
        return {"ready": True}

    return app


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: the learner decides the shutdown order."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_learner(
    learner: Learner,
    host: str,
    port: int,
    stop: asyncio.Event,
    progress: Callable[[Learner], None] | None = None,
    progress_seconds: float = 10.0,
) -> None:
    """Start the learner, serve its endpoint and train until `stop`; then drain, publish, close."""
    await learner.start()  # the first version is published before any actor can fetch weights
    server = _Server(uvicorn.Config(learner_app(learner), host=host, port=port, log_level="warning",
                                    access_log=False, lifespan="off"))  # fmt: skip
    serving = asyncio.create_task(server.serve())
    training = asyncio.create_task(learner.run(stop))
    try:
        while not stop.is_set():
            if serving.done():  # e.g. the port was taken: nothing can reach this learner
                stop.set()
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), progress_seconds)
            if progress is not None:
                progress(learner)
        await training
    finally:
        training.cancel()
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await training
        with contextlib.suppress(SystemExit):  # uvicorn exits the process when it cannot bind
            await serving
    if not server.started:
        raise RuntimeError(f"the learner endpoint never listened on {host}:{port}")
    if progress is not None:
        progress(learner)
