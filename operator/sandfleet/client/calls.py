"""The calls the client makes whose bodies take building: each body is one of sandfleet.wire's."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from sandfleet.client.results import Lease
from sandfleet.client.sending import Call
from sandfleet.wire import (
    AcquireAnswer,
    AcquireBody,
    ExecBody,
    PolicyMode,
    ProfileQuery,
    PublishPolicyBody,
    SpanBody,
    SpansBody,
    SpanSource,
)


def acquire_call(
    pool: str,
    count: int,
    regions: Sequence[str],
    ttl_seconds: int | None,
    labels: dict[str, str] | None,
    policy_version: int | None,
    wait_seconds: float,
    idempotency_key: str | None,
    image: str | None = None,
    min_count: int | None = None,
) -> Call:
    body: AcquireBody = {
        "pool": pool,
        "count": count,
        "regions": list(regions),
        "labels": labels or {},
        "wait_seconds": wait_seconds,
        # A key per call makes retrying the POST safe: the gateway returns the same leases.
        "idempotency_key": idempotency_key or uuid.uuid4().hex,
    }
    if ttl_seconds is not None:
        body["ttl_seconds"] = ttl_seconds
    if policy_version is not None:
        body["policy_version"] = policy_version
    if image is not None:
        body["image"] = image
    if min_count is not None:
        body["min_count"] = min_count
    return Call("POST", "/v1/leases", json=body, retry=True, fresh_key=idempotency_key is None)


def leases_from(answer: AcquireAnswer) -> list[Lease]:
    return [Lease.of(item, answer.get("timings")) for item in answer["leases"]]


def exec_body(
    command: Sequence[str] | str,
    env: dict[str, str] | None,
    cwd: str | None,
    stdin: str | None,
    timeout_s: float | None,
    max_output_bytes: int | None = None,
    encoding: str | None = None,
) -> ExecBody:
    body: ExecBody = {"shell": command} if isinstance(command, str) else {"argv": list(command)}
    if max_output_bytes is not None:
        body["max_output_bytes"] = max_output_bytes
    if encoding is not None:
        body["encoding"] = encoding
    if env:
        body["env"] = env
    if cwd:
        body["cwd"] = cwd
    if stdin is not None:
        body["stdin"] = stdin
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    return body


@dataclass(frozen=True)
class SpanReport:
    """One timed phase of the loop (unix seconds), reported to the gateway's profiler."""

    phase: str
    start: float
    end: float
    source: SpanSource = "actor"
    worker: str = ""

    def body(self) -> SpanBody:
        return {
            "phase": self.phase,
            "start": self.start,
            "end": self.end,
            "source": self.source,
            "worker": self.worker,
        }


def publish_call(run: str, version: int, staleness_bound: int | None, mode: PolicyMode | None) -> Call:
    body: PublishPolicyBody = {"version": version}
    if staleness_bound is not None:
        body["staleness_bound"] = staleness_bound
    if mode is not None:
        body["mode"] = mode
    # Republishing the same version is harmless, so retrying is safe.
    return Call("POST", f"/v1/runs/{run}/policy", json=body, retry=True)


def spans_call(run: str, spans: Sequence[SpanReport], dropped_stale: int) -> Call:
    body: SpansBody = {"spans": [span.body() for span in spans], "dropped_stale": dropped_stale}
    return Call("POST", f"/v1/runs/{run}/spans", json=body)


def profile_call(run: str, window_seconds: float) -> Call:
    query: ProfileQuery = {"window_seconds": window_seconds}
    return Call("GET", f"/v1/runs/{run}/profile", params=query, retry=True)
