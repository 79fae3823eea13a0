"""The actor's side of the learner's HTTP endpoint: POST trajectories, GET the newest weights.

Experience and weights travel between actors and the learner directly, as in real async RL
systems (the sandbox gateway only hands out sandboxes and policy versions; it is not a data bus).
The endpoint itself is `sandfleet.rl.service`; this is the `PolicyLink` actors use to reach it.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import httpx
from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
    wait_exponential,
)

from sandfleet.rl.policy import SoftmaxPolicy, Trajectory

WEIGHTS_PATH = "/v1/weights"
TRAJECTORIES_PATH = "/v1/trajectories"
STATS_PATH = "/v1/stats"


class LearnerUnavailable(RuntimeError):
    """The learner did not answer (or refused) after the retries."""


def _busy(response: httpx.Response) -> bool:
    """A 429 or 503: the learner is starting, busy or restarting, and the call is worth repeating."""
    return response.status_code in (429, 503)


def _problem(attempt: Future[httpx.Response]) -> str:
    """What went wrong with the last try: the learner's busy answer, or the connection's error."""
    error = attempt.exception()
    if error is not None:
        return f"{type(error).__name__}: {error}"
    response = attempt.result()
    return f"HTTP {response.status_code}: {response.text[:200]}"


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
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(httpx.TransportError) | retry_if_result(_busy),
            stop=stop_after_attempt(1 + self.retries),
            wait=wait_exponential(multiplier=0.4, max=3.0),  # 0.4 s, 0.8 s, 1.6 s, then 3 s
        )
        try:
            response: httpx.Response = await retrying(self.http.request, method, path, **options)
        except RetryError as gave_up:
            raise LearnerUnavailable(
                f"the learner at {self.url} did not take {method} {path}: {_problem(gave_up.last_attempt)}"
            ) from None
        try:
            response.raise_for_status()
        except httpx.HTTPStatusError as error:
            raise LearnerUnavailable(f"the learner at {self.url} refused {method} {path}: {error}") from None
        return response

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
