"""The actor's side of the learner's HTTP endpoint: POST trajectories, GET the newest weights.

Experience and weights travel between actors and the learner directly, as in real async RL
systems (the sandbox gateway only hands out sandboxes and policy versions; it is not a data bus).
The endpoint itself is `sandfleet.rl.service`; this is the `PolicyLink` actors use to reach it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from sandfleet.rl.policy import SoftmaxPolicy, Trajectory

WEIGHTS_PATH = "/v1/weights"
TRAJECTORIES_PATH = "/v1/trajectories"
STATS_PATH = "/v1/stats"


class LearnerUnavailable(RuntimeError):
    """The learner did not answer (or refused) after the retries."""


class LearnerClient:
    """Weights (cached; re-fetched only when the learner has a newer version) and trajectory sends."""

    def __init__(
        self,
        url: str,
        timeout: float = 30.0,
        retries: int = 5,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.retries = retries
        self.http = httpx.AsyncClient(base_url=self.url, timeout=timeout, transport=transport)
        self.cached: SoftmaxPolicy | None = None
        self.fetches = 0  # weight transfers that brought a new version (the rest were 204s)

    async def __aenter__(self) -> LearnerClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.http.aclose()

    async def _request(self, method: str, path: str, **options: Any) -> httpx.Response:
        """One call, retried on connection errors, 429 and 503 (a learner starting, busy or restarting)."""
        attempt = 0
        while True:
            try:
                response = await self.http.request(method, path, **options)
                if response.status_code not in (429, 503):
                    response.raise_for_status()
                    return response
                problem = f"HTTP {response.status_code}: {response.text[:200]}"
            except httpx.TransportError as error:
                problem = f"{type(error).__name__}: {error}"
            except httpx.HTTPStatusError as error:
                raise LearnerUnavailable(
                    f"the learner at {self.url} refused {method} {path}: {error}"
                ) from None
            attempt += 1
            if attempt > self.retries:
                raise LearnerUnavailable(f"the learner at {self.url} did not take {method} {path}: {problem}")
            await asyncio.sleep(min(0.2 * 2**attempt, 3.0))

    async def weights(self) -> SoftmaxPolicy:
        """The newest published weights; a 204 (nothing newer than ours) keeps the cached copy."""
        newer_than = self.cached.version if self.cached is not None else -1
        response = await self._request("GET", WEIGHTS_PATH, params={"newer_than": newer_than})
        if response.status_code == 204 and self.cached is not None:
            return self.cached
        self.cached = SoftmaxPolicy.from_json(response.json())
        self.fetches += 1
        return self.cached

    async def send(self, trajectory: Trajectory) -> None:
        await self.send_many([trajectory])

    async def send_many(self, trajectories: list[Trajectory]) -> int:
        """POST trajectories; how many the learner accepted."""
        body = {"trajectories": [t.to_json() for t in trajectories]}
        response = await self._request("POST", TRAJECTORIES_PATH, json=body)
        return int(response.json()["accepted"])

    async def stats(self) -> dict[str, Any]:
        return dict((await self._request("GET", STATS_PATH)).json())
