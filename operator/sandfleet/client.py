"""The typed Python client, async and sync: lease sandboxes, run commands, move files, evaluate.

    async with AsyncFleet() as fleet:      # SANDFLEET_URL, SANDFLEET_TOKEN (or SANDFLEET_TOKEN_FILE)
        async with fleet.lease(pool="python", labels={"run": "r1"}) as sb:
            result = await sb.exec(["python", "-c", "print(6 * 7)"])

The blocking client (`Fleet`, `Sandbox`) is the async one run on a private event-loop thread:
every call is written once, in `AsyncFleet` and `AsyncSandbox`.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import os
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, cast

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from sandfleet.wire import BAD_PATCH, FRESH_KEY_HEADER, FROM_SANDBOX, VERIFIER_CANNOT_RUN

# Re-exported: callers read `Evaluation.outcome` as `sandfleet.client.Outcome`.
from sandfleet.wire import Outcome as Outcome

DEFAULT_URL = "http://127.0.0.1:8080"


class SandfleetError(Exception):
    """An error the gateway answered with; `code` is stable, `detail` says what to do."""

    def __init__(self, status: int, code: str, detail: str, body: dict[str, Any] | None = None):
        super().__init__(f"{detail} (HTTP {status}, {code})")
        self.status = status
        self.code = code
        self.detail = detail
        self.body = body or {}

    @property
    def infrastructure(self) -> bool:
        """Whether the fleet failed (not the request, not the episode): a trainer masks such episodes."""
        return self.status >= 500 and self.status != 504


class SandboxError(SandfleetError):
    """The sandbox's agent refused or failed (`source: sandbox`): `code` is the agent's own."""


class Unauthorized(SandfleetError):
    """401: no or unknown token (set SANDFLEET_TOKEN or pass token=)."""


class Forbidden(SandfleetError):
    """403: the caller may not use this pool or lease."""


class NotFound(SandfleetError):
    """404: no such pool or lease."""


class LeaseEnded(SandfleetError):
    """410: the lease was released or expired; its sandbox is gone."""


class PolicyConflict(SandfleetError):
    """409: the episode's policy version is beyond its run's staleness bound (or a version went back)."""


class QueueFull(SandfleetError):
    """429: the pool's queue is full; `retry_after` says when to come back."""

    @property
    def retry_after(self) -> int:
        return int(self.body.get("retry_after_seconds", 1))


class NoSandboxInTime(SandfleetError):
    """504: no warm sandbox within the wait; the body has the queue position and ETA."""


class SandboxLost(SandfleetError):
    """502: the sandbox's agent stopped answering."""


class Unavailable(SandfleetError):
    """503: the gateway or its Kubernetes API is briefly unavailable; safe to retry."""


_ERRORS: dict[int, type[SandfleetError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: PolicyConflict,
    410: LeaseEnded,
    429: QueueFull,
    502: SandboxLost,
    503: Unavailable,
    504: NoSandboxInTime,
}
RETRYABLE = (Unavailable,)


@dataclass(frozen=True)
class Lease:
    """A lease as the gateway returned it."""

    id: str
    pool: str
    sandbox: str
    region: str
    expires_at: float
    labels: dict[str, str]
    policy_version: int | None
    timings: dict[str, float] = field(default_factory=dict)
    image_digest: str = ""  # exactly what the episode runs on: the image's digest ...
    template_hash: str = ""  # ... and the hash of the pool template its sandbox was made from

    @classmethod
    def of(cls, data: dict[str, Any], timings: dict[str, float] | None = None) -> Lease:
        return cls(
            id=data["id"],
            pool=data["pool"],
            sandbox=data["sandbox"],
            region=data["region"],
            expires_at=data["expires_at"],
            labels=data.get("labels", {}),
            policy_version=data.get("policy_version"),
            timings=timings or {},
            image_digest=str(data.get("image_digest") or ""),
            template_hash=str(data.get("template_hash") or ""),
        )


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one command in a sandbox."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    raw: dict[str, Any] = field(default_factory=dict)
    encoding: str = "utf-8"

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def truncated(self) -> bool:
        """Whether the output cap (`max_output_bytes`) cut either stream."""
        return self.stdout_truncated or self.stderr_truncated

    def data(self, stream: str = "stdout") -> bytes:
        """A stream's bytes as captured (exact with `encoding="base64"`, else UTF-8 with replacements)."""
        text = self.stdout if stream == "stdout" else self.stderr
        return base64.b64decode(text) if self.encoding == "base64" else text.encode()

    @classmethod
    def of(cls, data: dict[str, Any]) -> ExecResult:
        return cls(
            exit_code=data.get("exit_code"),
            stdout=data.get("stdout", ""),
            stderr=data.get("stderr", ""),
            timed_out=bool(data.get("timed_out")),
            duration_s=float(data.get("duration_s", 0.0)),
            stdout_truncated=bool(data.get("stdout_truncated")),
            stderr_truncated=bool(data.get("stderr_truncated")),
            raw=data,
            encoding=str(data.get("encoding", "utf-8")),
        )


@dataclass(frozen=True)
class Evaluation(Mapping[str, Any]):
    """An evaluation's result: typed fields, and the response itself (`result["exec"]` still works).

    `outcome` is the agent's (docs/tasks.md, "How rewards are computed"); `Sandbox.score` also
    turns a sandbox lost or an agent failure into INFRA_ERROR and a patch that does not apply into
    FAILED, instead of raising.
    """

    outcome: Outcome
    reward: float
    counts: dict[str, int] = field(default_factory=dict)
    tests: list[dict[str, Any]] = field(default_factory=list)
    reason: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        """Whether the episode's reward may be trained on (false for INFRA_ERROR)."""
        return self.outcome is not Outcome.INFRA_ERROR

    @classmethod
    def of(cls, data: dict[str, Any]) -> Evaluation:
        try:
            outcome = Outcome(str(data.get("outcome")))
        except ValueError:
            # An agent from before typed outcomes: its reward is all there is to go on.
            outcome = Outcome.PASSED if float(data.get("reward", 0.0)) >= 1.0 else Outcome.FAILED
        return cls(
            outcome=outcome,
            reward=float(data.get("reward", 0.0)),
            counts={str(k): int(v) for k, v in dict(data.get("counts") or {}).items()},
            tests=list(data.get("tests") or []),
            reason=data.get("outcome_reason"),
            raw=data,
        )

    @classmethod
    def of_error(cls, error: SandfleetError) -> Evaluation | None:
        """The evaluation an error amounts to, or None when it is the caller's to fix."""
        if error.code == BAD_PATCH:
            outcome = Outcome.FAILED  # the episode's patch: scored, not masked
        elif error.infrastructure or error.code in VERIFIER_CANNOT_RUN:
            outcome = Outcome.INFRA_ERROR
        else:
            return None
        raw = {"outcome": str(outcome), "reward": 0.0, "outcome_reason": error.detail, "error": error.code}
        return cls(outcome=outcome, reward=0.0, reason=error.detail, raw=raw)

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)


@dataclass(frozen=True)
class _Call:
    """One HTTP call, independent of sync or async sending."""

    method: str
    path: str
    json: Any = None
    params: dict[str, Any] | None = None
    content: bytes | None = None
    retry: bool = False  # only calls that are safe to repeat
    # An acquire whose idempotency key the client made itself: its first try says the key is new
    # (the gateway then skips reading back what an earlier try was answered with; there is none).
    fresh_key: bool = False


def error_for(status: int, body: object) -> SandfleetError:
    """The typed exception for an error response's status and JSON body.

    The gateway answers every error as a Problem (`error`, `detail`, and `source: sandbox` for a
    refusal from inside the sandbox); an agent's own shape (`{"error": {"code", "message"}}`) is
    read too, so a code is never a stringified object.
    """
    problem = body if isinstance(body, dict) else {}
    error = problem.get("error")
    from_sandbox = problem.get("source") == FROM_SANDBOX or isinstance(error, dict)
    if isinstance(error, dict):
        code, detail = error.get("code"), error.get("message")
    else:
        code, detail = error, problem.get("detail")
    kind = SandboxError if from_sandbox and status != 502 else _ERRORS.get(status, SandfleetError)
    text = detail if isinstance(detail, str) and detail else f"HTTP {status} with no detail"
    return kind(status, code if isinstance(code, str) and code else "error", text, problem)


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body: object = response.json()
    except ValueError:
        body = {"error": "http_error", "detail": response.text[:500]}
    raise error_for(response.status_code, body)


def _acquire_call(
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
) -> _Call:
    body: dict[str, Any] = {
        "pool": pool,
        "count": count,
        "regions": list(regions),
        "labels": labels or {},
        "wait_seconds": wait_seconds,
        # A key per call makes retrying the POST safe: the gateway returns the same leases.
        "idempotency_key": idempotency_key or uuid.uuid4().hex,
    }
    fresh_key = idempotency_key is None
    if ttl_seconds is not None:
        body["ttl_seconds"] = ttl_seconds
    if policy_version is not None:
        body["policy_version"] = policy_version
    if image is not None:
        body["image"] = image
    if min_count is not None:
        body["min_count"] = min_count
    return _Call("POST", "/v1/leases", json=body, retry=True, fresh_key=fresh_key)


def _leases_from(data: dict[str, Any]) -> list[Lease]:
    return [Lease.of(item, data.get("timings")) for item in data["leases"]]


def _exec_body(
    command: Sequence[str] | str,
    env: dict[str, str] | None,
    cwd: str | None,
    stdin: str | None,
    timeout_s: float | None,
    max_output_bytes: int | None = None,
    encoding: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"shell": command} if isinstance(command, str) else {"argv": list(command)}
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
    source: str = "actor"
    worker: str = ""


def _publish_call(run: str, version: int, staleness_bound: int | None, mode: str | None) -> _Call:
    body: dict[str, Any] = {"version": version}
    if staleness_bound is not None:
        body["staleness_bound"] = staleness_bound
    if mode is not None:
        body["mode"] = mode
    # Republishing the same version is harmless, so retrying is safe.
    return _Call("POST", f"/v1/runs/{run}/policy", json=body, retry=True)


def _spans_call(run: str, spans: Sequence[SpanReport], dropped_stale: int) -> _Call:
    body = {
        "spans": [
            {"phase": s.phase, "start": s.start, "end": s.end, "source": s.source, "worker": s.worker}
            for s in spans
        ],
        "dropped_stale": dropped_stale,
    }
    return _Call("POST", f"/v1/runs/{run}/spans", json=body)


def _profile_call(run: str, window_seconds: float) -> _Call:
    return _Call("GET", f"/v1/runs/{run}/profile", params={"window_seconds": window_seconds}, retry=True)


class TokenFile(httpx.Auth):
    """A bearer token read from a file, re-read when the file changes.

    Kubernetes rotates a projected ServiceAccount token in place (the gateway reviews it with
    TokenReview), so a long-running actor or learner must not keep the first one it read.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._seen: tuple[float, str] | None = None

    def token(self) -> str:
        mtime = self.path.stat().st_mtime
        if self._seen is None or self._seen[0] != mtime:
            self._seen = (mtime, self.path.read_text().strip())
        return self._seen[1]

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self.token()}"
        yield request


def _settings(
    url: str | None, token: str | None, token_file: str | Path | None = None
) -> tuple[str, dict[str, str], httpx.Auth | None]:
    """Base URL, static headers and auth: a token given wins over a token file, arguments over env."""
    url = url or os.environ.get("SANDFLEET_URL", DEFAULT_URL)
    if token is None and token_file is None:
        token = os.environ.get("SANDFLEET_TOKEN")
        token_file = None if token else os.environ.get("SANDFLEET_TOKEN_FILE")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return url.rstrip("/"), headers, (TokenFile(token_file) if token_file and not token else None)


# -- async ------------------------------------------------------------------------------------


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
        base, headers, auth = _settings(url, token, token_file)
        self.retries = retries
        self.http = httpx.AsyncClient(
            base_url=base, headers=headers, auth=auth, timeout=timeout, transport=transport
        )

    async def __aenter__(self) -> AsyncFleet:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.http.aclose()

    async def call(self, call: _Call) -> httpx.Response:
        """Send one call; one safe to repeat is retried on transport errors and 503s, backing off."""
        retrying = AsyncRetrying(
            retry=retry_if_exception_type((httpx.TransportError, *RETRYABLE)),
            stop=stop_after_attempt(1 + (self.retries if call.retry else 0)),
            wait=wait_exponential(multiplier=0.4, max=2.0),  # 0.4 s, 0.8 s, 1.6 s, then 2 s
            reraise=True,
        )
        tries = [0]

        async def send() -> httpx.Response:
            tries[0] += 1
            return await self._send(call, fresh=call.fresh_key and tries[0] == 1)

        return await retrying(send)

    async def _send(self, call: _Call, fresh: bool = False) -> httpx.Response:
        headers = {FRESH_KEY_HEADER: "true"} if fresh else None
        response = await self.http.request(
            call.method, call.path, json=call.json, params=call.params, content=call.content, headers=headers
        )
        _raise_for(response)
        return response

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
        call = _acquire_call(
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
        return _leases_from((await self.call(call)).json())

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
        response = await self.call(_Call("DELETE", f"/v1/leases/{lease_id}", retry=True))
        return bool(response.json()["released"])

    async def release_run(self, run: str) -> list[str]:
        response = await self.call(_Call("POST", f"/v1/runs/{run}/release", retry=True))
        return list(response.json()["released"])

    async def renew(self, lease_id: str, ttl_seconds: int | None = None) -> Lease:
        body = {"ttl_seconds": ttl_seconds} if ttl_seconds else {}
        response = await self.call(_Call("POST", f"/v1/leases/{lease_id}/renew", json=body, retry=True))
        return Lease.of(response.json()["lease"])

    async def leases(self, pool: str | None = None, run: str | None = None) -> list[Lease]:
        params = {k: v for k, v in {"pool": pool, "run": run}.items() if v}
        response = await self.call(_Call("GET", "/v1/leases", params=params, retry=True))
        return [Lease.of(item) for item in response.json()["leases"]]

    async def pools(self) -> list[dict[str, Any]]:
        response = await self.call(_Call("GET", "/v1/pools", retry=True))
        return list(response.json()["pools"])

    async def publish_policy(
        self, run: str, version: int, staleness_bound: int | None = None, mode: str | None = None
    ) -> dict[str, Any]:
        """Publish the learner's policy version for `run` (and optionally its staleness rules)."""
        return dict((await self.call(_publish_call(run, version, staleness_bound, mode))).json())

    async def policy(self, run: str) -> dict[str, Any]:
        return dict((await self.call(_Call("GET", f"/v1/runs/{run}/policy", retry=True))).json())

    async def report_spans(self, run: str, spans: Sequence[SpanReport], dropped_stale: int = 0) -> int:
        """Send phase spans to the loop profiler; how many it recorded."""
        if not spans and not dropped_stale:
            return 0
        return int((await self.call(_spans_call(run, spans, dropped_stale))).json()["recorded"])

    async def profile(self, run: str, window_seconds: float = 300.0) -> dict[str, Any]:
        """The run's loop profile over the last `window_seconds`: split, percentiles, verdict."""
        return dict((await self.call(_profile_call(run, window_seconds))).json())


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
        body = _exec_body(command, env, cwd, stdin, timeout_s, max_output_bytes, encoding)
        response = await self.fleet.call(_Call("POST", f"{self._base}/exec", json=body))
        return ExecResult.of(response.json())

    async def read_file(self, path: str) -> bytes:
        call = _Call("GET", f"{self._base}/files", params={"path": path}, retry=True)
        return (await self.fleet.call(call)).content

    async def write_file(self, path: str, data: bytes | str) -> None:
        content = data.encode() if isinstance(data, str) else data
        call = _Call("PUT", f"{self._base}/files", params={"path": path}, content=content, retry=True)
        await self.fleet.call(call)

    async def list_files(self, path: str = ".") -> dict[str, Any]:
        call = _Call("GET", f"{self._base}/files/list", params={"path": path}, retry=True)
        return dict((await self.fleet.call(call)).json())

    async def upload_archive(self, path: str, data: bytes) -> dict[str, Any]:
        """Unpack a tar (plain or compressed; `tar -C dir -czf - .` works) into directory `path`."""
        call = _Call("PUT", f"{self._base}/files/archive", params={"path": path}, content=data, retry=True)
        return dict((await self.fleet.call(call)).json())

    async def download_archive(self, path: str, gzip: bool = True) -> bytes:
        """A tar (gzipped unless told otherwise) of the tree at `path`."""
        params = {"path": path, "gzip": "1" if gzip else "0"}
        return (
            await self.fleet.call(_Call("GET", f"{self._base}/files/archive", params=params, retry=True))
        ).content

    async def evaluate(self, /, **body: Any) -> Evaluation:
        """Apply `patch`, run the tests (`argv`/`shell`, else tests/test.sh); errors raise.

        The body's fields are `sandfleet.wire.EvaluateRequest`'s (a `task` scores by its own tests).
        Pass `require_report=True` when the tests write a JUnit report: without one the outcome is
        INFRA_ERROR rather than a zero reward.
        """
        call = _Call("POST", f"{self._base}/evaluate", json=body)
        return Evaluation.of(dict((await self.fleet.call(call)).json()))

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


# -- sync ---------------------------------------------------------------------------------------

T = TypeVar("T")
P = ParamSpec("P")
A = TypeVar("A")


class _LoopThread:
    """A private event loop on a daemon thread, where a blocking client runs its async twin."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sandfleet-client", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # an interrupted caller does not leave its call running
            raise

    def stop(self) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)

    def close(self) -> None:
        self.stop()
        self._thread.join()
        self.loop.close()


class _Blocking(Generic[A]):
    """A blocking face over the async object `_async`."""

    _async: A

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError


def _blocking(
    method: Callable[Concatenate[A, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[_Blocking[A], P], T]:
    """The blocking twin of an async method: the same call, run to its end on the private loop."""

    @functools.wraps(method)
    def run(self: _Blocking[A], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(method(self._async, *args, **kwargs))

    return run


class _ThreadedTransport(httpx.AsyncBaseTransport):
    """A blocking httpx transport (passed to `Fleet`) driven from the private loop."""

    def __init__(self, transport: httpx.BaseTransport) -> None:
        self.transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        def send() -> httpx.Response:
            response = self.transport.handle_request(request)
            stream = cast(httpx.SyncByteStream, response.stream)  # what a blocking transport answers with
            try:
                # The stream's raw bytes, so the async client decodes them once, as the blocking one would.
                raw = b"".join(stream)
            finally:
                stream.close()
            return httpx.Response(
                response.status_code, headers=response.headers, content=raw, extensions=response.extensions
            )

        return await asyncio.to_thread(send)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.transport.close)


class Fleet(_Blocking[AsyncFleet]):
    """Blocking client for one gateway, with the same calls as AsyncFleet (which it runs)."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        timeout: float = 660.0,
        retries: int = 3,
        transport: httpx.BaseTransport | None = None,
        token_file: str | Path | None = None,
    ) -> None:
        self._loop = _LoopThread()
        # A Fleet dropped without close stops its loop rather than keep a thread per instance.
        weakref.finalize(self, self._loop.stop)
        sender = (
            transport
            if transport is None or isinstance(transport, httpx.AsyncBaseTransport)
            else _ThreadedTransport(transport)
        )

        async def make() -> AsyncFleet:
            return AsyncFleet(url, token, timeout, retries, sender, token_file)

        self._async = self._run(make())

    @property
    def retries(self) -> int:
        return self._async.retries

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self._loop.run(coroutine)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections and stop the private loop."""
        if not self._loop.loop.is_closed():
            self._run(self._async.http.aclose())
            self._loop.close()

    @contextmanager
    def _entered(self, manager: AbstractAsyncContextManager[T]) -> Iterator[T]:
        """Enter and exit an async context manager on the private loop."""
        value = self._run(manager.__aenter__())
        try:
            yield value
        except BaseException as error:
            if not self._run(manager.__aexit__(type(error), error, error.__traceback__)):
                raise
        else:
            self._run(manager.__aexit__(None, None, None))

    @contextmanager
    def lease(self, pool: str, **options: Any) -> Iterator[Sandbox]:
        """One sandbox for one episode; released on exit, whatever happened inside."""
        with self._entered(self._async.lease(pool, **options)) as sandbox:
            yield Sandbox(self, sandbox.lease)

    @contextmanager
    def group(self, pool: str, count: int, **options: Any) -> Iterator[list[Sandbox]]:
        """`count` sandboxes at once, all or nothing (a GRPO group); released on exit."""
        with self._entered(self._async.group(pool, count, **options)) as sandboxes:
            yield [Sandbox(self, sandbox.lease) for sandbox in sandboxes]

    @contextmanager
    def batch(self, pool: str, count: int, min_count: int = 1, **options: Any) -> Iterator[list[Sandbox]]:
        """Up to `count` sandboxes for a step, at least `min_count`, in `wait_seconds`; released on exit."""
        with self._entered(self._async.batch(pool, count, min_count, **options)) as sandboxes:
            yield [Sandbox(self, sandbox.lease) for sandbox in sandboxes]

    call = _blocking(AsyncFleet.call)
    acquire = _blocking(AsyncFleet.acquire)
    release = _blocking(AsyncFleet.release)
    release_run = _blocking(AsyncFleet.release_run)
    renew = _blocking(AsyncFleet.renew)
    leases = _blocking(AsyncFleet.leases)
    pools = _blocking(AsyncFleet.pools)
    publish_policy = _blocking(AsyncFleet.publish_policy)
    policy = _blocking(AsyncFleet.policy)
    report_spans = _blocking(AsyncFleet.report_spans)
    profile = _blocking(AsyncFleet.profile)


class Sandbox(_Blocking[AsyncSandbox]):
    """A leased sandbox (blocking calls), with the same calls as AsyncSandbox (which it runs)."""

    def __init__(self, fleet: Fleet, lease: Lease) -> None:
        self.fleet = fleet
        self._async = AsyncSandbox(fleet._async, lease)

    @property
    def lease(self) -> Lease:
        return self._async.lease

    @lease.setter
    def lease(self, lease: Lease) -> None:
        self._async.lease = lease

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.fleet._run(coroutine)

    exec = _blocking(AsyncSandbox.exec)
    read_file = _blocking(AsyncSandbox.read_file)
    write_file = _blocking(AsyncSandbox.write_file)
    list_files = _blocking(AsyncSandbox.list_files)
    evaluate = _blocking(AsyncSandbox.evaluate)
    score = _blocking(AsyncSandbox.score)
    upload_archive = _blocking(AsyncSandbox.upload_archive)
    download_archive = _blocking(AsyncSandbox.download_archive)
    renew = _blocking(AsyncSandbox.renew)
    release = _blocking(AsyncSandbox.release)
