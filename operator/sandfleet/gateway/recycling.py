"""Resetting a sandbox Pod in place through its agent: the reset, its probe, and what the probe found.

A Pod cannot be checkpointed and restored through a kubelet, so a recycling pool's agent resets
itself (`POST /v1/reset`, see sandfleet_agent.reset) and answers with a probe of the result and the
probe it took of itself before it served anything (its golden state). The comparison is ours
(`core.recycle.probe_problems`): a sandbox goes back to its run only when it finds nothing.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import aiohttp
from prometheus_client import Counter, Histogram
from yarl import URL

from sandfleet.core.agent_tokens import agent_token
from sandfleet.core.model import SandboxPod
from sandfleet.core.recycle import fingerprint_from_json, probe_problems

# A reset copies the writable roots back: seconds for a large repository, never minutes.
RESET_TIMEOUT_SECONDS = 60.0
RESET_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
# How a reset ended: kept for its run, its probe found the episode's traces, or it failed outright.
RESET_OUTCOMES = ("recycled", "probe_failed", "reset_failed")


@dataclass(frozen=True)
class ResetResult:
    """What a reset did: nothing (another gateway reset it first), or a verdict and what it cost."""

    problems: tuple[str, ...]  # empty: reset and probed clean
    seconds: float
    already_reset: bool = False
    probed: bool = False  # the reset ran and its probe was compared (problems are the probe's)

    @property
    def outcome(self) -> str:
        return "recycled" if self.clean else "probe_failed" if self.probed else "reset_failed"

    @property
    def clean(self) -> bool:
        return not self.problems and not self.already_reset


class AgentResets:
    """Resets sandboxes through their agents (each call carries the sandbox's own token).

    On aiohttp rather than httpx: a recycling pool resets every one of its sandboxes once per
    episode, and a connection is worth keeping per sandbox; aiohttp's connector files them by host,
    where httpx's pool scans every connection it keeps on each request (measured: 45 ms of CPU per
    reset with 4,096 kept, against under 1 ms here).
    """

    def __init__(self, agent_key: bytes | None, timeout: float = RESET_TIMEOUT_SECONDS) -> None:
        self.agent_key = agent_key
        self.timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=5.0)
        self._session: aiohttp.ClientSession | None = None
        self.resets, self.reset_seconds = reset_metrics(
            "How long a reset took: the agent's reset and probe, one round trip from the gateway."
        )

    def metrics(self) -> tuple[Counter, Histogram]:
        return (self.resets, self.reset_seconds)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _client(self) -> aiohttp.ClientSession:
        # Made on first use: a session belongs to the event loop it was made on.
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=2, keepalive_timeout=120)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)
        return self._session

    async def reset(self, sandbox: SandboxPod, episode: int) -> ResetResult:
        """Reset `sandbox` to serve `episode` next, and judge the result by its probe."""
        started = time.monotonic()
        url = sandbox.agent_url()
        if url is None:
            return ResetResult(("the Pod has no address",), 0.0)
        headers = {"content-type": "application/json"}
        if self.agent_key is not None:
            headers["authorization"] = f"Bearer {agent_token(self.agent_key, sandbox.name)}"
        # A URL built already (nothing to quote in an address and a fixed path) and a body encoded
        # already: aiohttp's URL parsing and JSON payload showed in the profile of every reset.
        target = URL(f"{url}/v1/reset", encoded=True)
        try:
            async with self._client().post(
                target, data=b'{"episode":%d}' % episode, headers=headers
            ) as answer:
                status, body = answer.status, _json(await answer.read())
        except (aiohttp.ClientError, TimeoutError) as error:
            failed = ResetResult((f"its agent did not answer the reset ({type(error).__name__})",), 0.0)
            self.resets.labels(sandbox.pool, failed.outcome).inc()
            return failed
        result = judge(status, body, sandbox.port, time.monotonic() - started)
        if not result.already_reset:
            self.resets.labels(sandbox.pool, result.outcome).inc()
            self.reset_seconds.labels(sandbox.pool).observe(result.seconds)
        return result


def reset_metrics(seconds_help: str) -> tuple[Counter, Histogram]:
    """The resets of recycling pools by outcome, and their durations (unregistered: the app serves them)."""
    resets = Counter(
        "sandfleet_sandbox_resets",
        "Sandboxes reset in place after an episode (recycling pools), by outcome.",
        ["pool", "result"],
        registry=None,
    )
    seconds = Histogram(
        "sandfleet_sandbox_reset_seconds", seconds_help, ["pool"], buckets=RESET_BUCKETS, registry=None
    )
    return resets, seconds


def judge(status: int, body: object, agent_port: int, seconds: float) -> ResetResult:
    """The verdict on an agent's answer to `POST /v1/reset` (status and JSON body)."""
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    if status == 409 and code == "episode_already_reset":
        return ResetResult((), seconds, already_reset=True)
    if status != 200 or not isinstance(body, dict):
        message = error.get("message") if isinstance(error, dict) else None
        return ResetResult((f"the reset failed ({status} {code or ''}: {message or body!r})",), seconds)
    if body.get("golden") is None:
        return ResetResult(("its agent kept no golden probe (started without a pristine copy)",), seconds)
    try:
        golden, seen = fingerprint_from_json(body["golden"]), fingerprint_from_json(body.get("probe"))
    except ValueError as malformed:
        return ResetResult((str(malformed),), seconds)
    return ResetResult(tuple(probe_problems(golden, seen, agent_port)), seconds, probed=True)


def _json(body: bytes) -> object:
    try:
        return json.loads(body)
    except ValueError:
        return None
