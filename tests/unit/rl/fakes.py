"""A fleet in memory for the loop's unit tests: leases, files, a reward knowing the fix, scripted failures."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from sandfleet.client import Evaluation, Lease, NotFound, SpanReport
from sandfleet.rl.catalogue_tasks import load_tasks
from sandfleet.tasks.catalogue import Task


@dataclass
class FakeSandbox:
    """One leased sandbox: files, and `score` rewarding exactly the upstream text (or a scripted outcome)."""

    lease: Lease
    files: dict[str, str]
    tasks: Sequence[Task]
    delay: float = 0.0
    scripted: list[dict[str, Any]] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)

    async def read_file(self, path: str) -> bytes:
        return self.files[path].encode()

    async def write_file(self, path: str, data: bytes | str) -> None:
        self.files[path] = data.decode() if isinstance(data, bytes) else data

    async def score(self, **body: Any) -> Evaluation:
        await asyncio.sleep(self.delay)
        self.bodies.append(body)
        if self.scripted:
            return Evaluation.of(self.scripted.pop(0))
        (task,) = [t for t in self.tasks if t.id == self.lease.labels["task"]]
        fixed = task.original in self.files[task.bug_path]
        return Evaluation.of({"outcome": "passed" if fixed else "failed", "reward": float(fixed)})


@dataclass
class FakeFleet:
    """The parts of AsyncFleet the loop uses, with what happened recorded."""

    tasks: Sequence[Task] = field(default_factory=load_tasks)
    evaluate_seconds: float = 0.0
    # Evaluation responses handed out before the real scoring, in order (e.g. an infra_error).
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    # Raised by the next leases instead of granting one (e.g. SandboxLost), in order.
    lease_failures: list[Exception] = field(default_factory=list)
    evaluated: list[dict[str, Any]] = field(default_factory=list)
    published: list[int] = field(default_factory=list)
    spans: list[SpanReport] = field(default_factory=list)
    live: dict[str, Lease] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)
    bound: int | None = None
    ids: itertools.count[int] = field(default_factory=itertools.count)
    batches: list[dict[str, Any]] = field(default_factory=list)  # what each batch acquire asked for
    batch_limit: int = 1_000_000  # the most sandboxes one batch gets

    async def policy(self, run: str) -> dict[str, Any]:
        if not self.published:
            raise NotFound(404, "no_policy", f"run {run!r} has no published policy")
        return {"run": run, "version": self.published[-1]}

    async def publish_policy(
        self, run: str, version: int, staleness_bound: int | None = None, mode: str | None = None
    ) -> dict[str, Any]:
        if self.published and version < self.published[-1]:
            raise AssertionError(f"version went back: {version} after {self.published[-1]}")
        self.published.append(version)
        self.bound = staleness_bound if staleness_bound is not None else self.bound
        return {"run": run, "version": version}

    async def report_spans(self, run: str, spans: Sequence[SpanReport], dropped_stale: int = 0) -> int:
        self.spans.extend(spans)
        return len(spans)

    def grant(self, labels: dict[str, str], policy_version: int | None) -> Lease:
        lease = Lease(f"local.s{next(self.ids)}", "default", "s", "local", 0.0, labels, policy_version)
        self.live[lease.id] = lease
        return lease

    @asynccontextmanager
    async def lease(self, pool: str, **options: Any) -> AsyncIterator[FakeSandbox]:
        if self.lease_failures:
            raise self.lease_failures.pop(0)
        lease = self.grant(dict(options.get("labels") or {}), options.get("policy_version"))
        files = {t.bug_path: f"head\n{t.broken}\ntail\n" for t in self.tasks}
        try:
            yield FakeSandbox(lease, files, self.tasks, self.evaluate_seconds, self.outcomes, self.evaluated)
        finally:
            await self.release(lease.id)

    @asynccontextmanager
    async def batch(
        self, pool: str, count: int, min_count: int = 1, **options: Any
    ) -> AsyncIterator[list[FakeSandbox]]:
        """Up to `count` sandboxes: `batch_limit` of them at most (what the pool had warm)."""
        self.batches.append({"count": count, "min_count": min_count, **options})
        if self.lease_failures:
            raise self.lease_failures.pop(0)
        leases = [
            self.grant(dict(options.get("labels") or {}), options.get("policy_version"))
            for _ in range(min(count, self.batch_limit))
        ]
        files = {t.bug_path: f"head\n{t.broken}\ntail\n" for t in self.tasks}
        try:
            yield [
                FakeSandbox(
                    lease, dict(files), self.tasks, self.evaluate_seconds, self.outcomes, self.evaluated
                )
                for lease in leases
            ]
        finally:
            for lease in leases:
                await self.release(lease.id)

    async def leases(self, pool: str | None = None, run: str | None = None) -> list[Lease]:
        return [lease for lease in self.live.values() if run is None or lease.labels.get("run") == run]

    async def release(self, lease_id: str) -> bool:
        if self.live.pop(lease_id, None) is None:
            return False
        self.released.append(lease_id)
        return True

    async def release_run(self, run: str) -> list[str]:
        mine = [lease.id for lease in await self.leases(run=run)]
        for lease_id in mine:
            await self.release(lease_id)
        return mine
