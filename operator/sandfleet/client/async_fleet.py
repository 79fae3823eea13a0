"""The async client: `AsyncFleet` for one gateway, `AsyncSandbox` for one leased sandbox.

Every call is written once, here; the blocking client (`blocking.py`) runs these on its own loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from sandfleet.client.calls import (
    SpanReport,
    acquire_call,
    exec_body,
    leases_from,
    profile_call,
    publish_call,
    spans_call,
)
from sandfleet.client.errors import SandfleetError
from sandfleet.client.results import Evaluation, ExecResult, Lease
from sandfleet.client.sending import Call, http_client, send
from sandfleet.wire import (
    EvaluationReport,
    ExecAnswer,
    LeaseAnswer,
    LeasesAnswer,
    LeasesQuery,
    PolicyAnswer,
    PolicyMode,
    PoolJson,
    PoolsAnswer,
    ProfileAnswer,
    ReleaseAnswer,
    RenewBody,
    RunReleaseAnswer,
    SpansAnswer,
)


class AsyncFleet:
    """Async client for one gateway."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        timeout: float = 660.0,
        retries: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
        token_file: str | Path | None = None,
    ) -> None:
        self.retries = retries
        self.http = http_client(url, token, token_file, timeout, transport)

    async def __aenter__(self) -> AsyncFleet:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.http.aclose()

    async def call(self, call: Call) -> httpx.Response:
        """Send one call; one safe to repeat is retried on transport errors and 503s, backing off."""
        return await send(self.http, call, self.retries)

    async def _answer(self, call: Call) -> Any:
        """A call's JSON answer (one of sandfleet.wire's `...Answer`s, as the caller declares it)."""
        return (await self.call(call)).json()

    async def acquire(
        self,
        pool: str,
        count: int = 1,
        regions: Sequence[str] = (),
        ttl_seconds: int | None = None,
        labels: dict[str, str] | None = None,
        policy_version: int | None = None,
        wait_seconds: float = 30.0,
        idempotency_key: str | None = None,
        image: str | None = None,
        min_count: int | None = None,
    ) -> list[Lease]:
        """Lease `count` sandboxes from `pool`; `image` picks a task image in it.

        All or nothing unless `min_count` is below `count`: then a batch, granted as soon as `count`
        are leased or when `wait_seconds` ends with at least `min_count` (fewer: NoSandboxInTime).
        """
        call = acquire_call(
            pool,
            count,
            regions,
            ttl_seconds,
            labels,
            policy_version,
            wait_seconds,
            idempotency_key,
            image,
            min_count,
        )
        return leases_from(await self._answer(call))

    @asynccontextmanager
    async def lease(self, pool: str, **options: Any) -> AsyncIterator[AsyncSandbox]:
        """One sandbox for one episode; released on exit, whatever happened inside."""
        (lease,) = await self.acquire(pool, count=1, **options)
        try:
            yield AsyncSandbox(self, lease)
        finally:
            await self.release(lease.id)

    @asynccontextmanager
    async def group(self, pool: str, count: int, **options: Any) -> AsyncIterator[list[AsyncSandbox]]:
        """`count` sandboxes at once, all or nothing (a GRPO group); released on exit."""
        leases = await self.acquire(pool, count=count, **options)
        try:
            yield [AsyncSandbox(self, lease) for lease in leases]
        finally:
            await asyncio.gather(*(self.release(lease.id) for lease in leases))

    @asynccontextmanager
    async def batch(
        self, pool: str, count: int, min_count: int = 1, **options: Any
    ) -> AsyncIterator[list[AsyncSandbox]]:
        """Up to `count` sandboxes for a step, at least `min_count`, within `wait_seconds`; released on exit.

        It yields as soon as `count` are leased, or at the end of the wait with what it got; fewer
        than `min_count` by then is NoSandboxInTime, and nothing is kept.
        """
        leases = await self.acquire(pool, count=count, min_count=min_count, **options)
        try:
            yield [AsyncSandbox(self, lease) for lease in leases]
        finally:
            await asyncio.gather(*(self.release(lease.id) for lease in leases))

    async def release(self, lease_id: str) -> bool:
        answer: ReleaseAnswer = await self._answer(Call("DELETE", f"/v1/leases/{lease_id}", retry=True))
        return bool(answer["released"])

    async def release_run(self, run: str) -> list[str]:
        answer: RunReleaseAnswer = await self._answer(Call("POST", f"/v1/runs/{run}/release", retry=True))
        return list(answer["released"])

    async def renew(self, lease_id: str, ttl_seconds: int | None = None) -> Lease:
        body: RenewBody = {"ttl_seconds": ttl_seconds} if ttl_seconds else {}
        call = Call("POST", f"/v1/leases/{lease_id}/renew", json=body, retry=True)
        answer: LeaseAnswer = await self._answer(call)
        return Lease.of(answer["lease"])

    async def leases(self, pool: str | None = None, run: str | None = None) -> list[Lease]:
        query: LeasesQuery = {}
        if pool:
            query["pool"] = pool
        if run:
            query["run"] = run
        answer: LeasesAnswer = await self._answer(Call("GET", "/v1/leases", params=query, retry=True))
        return [Lease.of(item) for item in answer["leases"]]

    async def pools(self) -> list[PoolJson]:
        answer: PoolsAnswer = await self._answer(Call("GET", "/v1/pools", retry=True))
        return list(answer["pools"])

    async def publish_policy(
        self, run: str, version: int, staleness_bound: int | None = None, mode: PolicyMode | None = None
    ) -> PolicyAnswer:
        """Publish the learner's policy version for `run` (and optionally its staleness rules)."""
        answer: PolicyAnswer = await self._answer(publish_call(run, version, staleness_bound, mode))
        return answer

    async def policy(self, run: str) -> PolicyAnswer:
        answer: PolicyAnswer = await self._answer(Call("GET", f"/v1/runs/{run}/policy", retry=True))
        return answer

    async def report_spans(self, run: str, spans: Sequence[SpanReport], dropped_stale: int = 0) -> int:
        """Send phase spans to the loop profiler; how many it recorded."""
        if not spans and not dropped_stale:
            return 0
        answer: SpansAnswer = await self._answer(spans_call(run, spans, dropped_stale))
        return int(answer["recorded"])

    async def profile(self, run: str, window_seconds: float = 300.0) -> ProfileAnswer:
        """The run's loop profile over the last `window_seconds`: split, percentiles, verdict."""
        answer: ProfileAnswer = await self._answer(profile_call(run, window_seconds))
        return answer


class AsyncSandbox:
    """A leased sandbox: everything goes through the gateway."""

    def __init__(self, fleet: AsyncFleet, lease: Lease) -> None:
        self.fleet = fleet
        self.lease = lease
        self._base = f"/v1/leases/{lease.id}"

    async def exec(
        self,
        command: Sequence[str] | str,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        timeout_s: float | None = None,
        max_output_bytes: int | None = None,
        encoding: str | None = None,
    ) -> ExecResult:
        """Run a command; output past `max_output_bytes` per stream (agent default 1 MiB) is cut.

        `encoding="base64"` returns the exact bytes (ExecResult.data); utf-8 replaces invalid ones.
        """
        body = exec_body(command, env, cwd, stdin, timeout_s, max_output_bytes, encoding)
        answer: ExecAnswer = await self.fleet._answer(Call("POST", f"{self._base}/exec", json=body))
        return ExecResult.of(answer)

    async def read_file(self, path: str) -> bytes:
        call = Call("GET", f"{self._base}/files", params={"path": path}, retry=True)
        return (await self.fleet.call(call)).content

    async def write_file(self, path: str, data: bytes | str) -> None:
        content = data.encode() if isinstance(data, str) else data
        call = Call("PUT", f"{self._base}/files", params={"path": path}, content=content, retry=True)
        await self.fleet.call(call)

    async def list_files(self, path: str = ".") -> dict[str, Any]:
        call = Call("GET", f"{self._base}/files/list", params={"path": path}, retry=True)
        return dict(await self.fleet._answer(call))

    async def upload_archive(self, path: str, data: bytes) -> dict[str, Any]:
        """Unpack a tar (plain or compressed; `tar -C dir -czf - .` works) into directory `path`."""
        call = Call("PUT", f"{self._base}/files/archive", params={"path": path}, content=data, retry=True)
        return dict(await self.fleet._answer(call))

    async def download_archive(self, path: str, gzip: bool = True) -> bytes:
        """A tar (gzipped unless told otherwise) of the tree at `path`."""
        params = {"path": path, "gzip": "1" if gzip else "0"}
        call = Call("GET", f"{self._base}/files/archive", params=params, retry=True)
        return (await self.fleet.call(call)).content

    async def evaluate(self, /, **body: Any) -> Evaluation:
        """Apply `patch`, run the tests (`argv`/`shell`, else tests/test.sh); errors raise.

        The body's fields are `sandfleet.wire.EvaluateRequest`'s (a `task` scores by its own tests).
        Pass `require_report=True` when the tests write a JUnit report: without one the outcome is
        INFRA_ERROR rather than a zero reward.
        """
        report: EvaluationReport = await self.fleet._answer(Call("POST", f"{self._base}/evaluate", json=body))
        return Evaluation.of(report)

    async def score(self, /, **body: Any) -> Evaluation:
        """Evaluate, never raising for what the episode or the fleet did.

        A lost sandbox or a failed agent is INFRA_ERROR (mask it); a patch that does not apply is
        FAILED with reward 0; a malformed request still raises.
        """
        try:
            return await self.evaluate(**body)
        except SandfleetError as error:
            scored = Evaluation.of_error(error)
            if scored is None:
                raise
            return scored

    async def renew(self, ttl_seconds: int | None = None) -> Lease:
        self.lease = await self.fleet.renew(self.lease.id, ttl_seconds)
        return self.lease

    async def release(self) -> bool:
        return await self.fleet.release(self.lease.id)
