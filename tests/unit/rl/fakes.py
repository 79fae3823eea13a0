"""A fleet in memory for the loop's unit tests: leases, files and a reward that knows the fix."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from sandfleet.client import Lease, NotFound, SpanReport
from sandfleet.rl.tasks import TASKS, Task, by_name


@dataclass
class FakeSandbox:
    """One leased sandbox: files, and `evaluate` rewarding exactly the upstream line."""

    lease: Lease
    files: dict[str, str]
    delay: float = 0.0

    async def read_file(self, path: str) -> bytes:
        return self.files[path].encode()

    async def write_file(self, path: str, data: bytes | str) -> None:
        self.files[path] = data.decode() if isinstance(data, bytes) else data

    async def evaluate(self, **body: Any) -> dict[str, Any]:
        await asyncio.sleep(self.delay)
        task = by_name(self.lease.labels["task"])
        fixed = task.original in self.files[f"{task.cwd}/{task.path}"]
        return {"reward": 1.0 if fixed else 0.0}


@dataclass
class FakeFleet:
    """The parts of AsyncFleet the loop uses, with what happened recorded."""

    tasks: Sequence[Task] = TASKS
    evaluate_seconds: float = 0.0
    published: list[int] = field(default_factory=list)
    spans: list[SpanReport] = field(default_factory=list)
    live: dict[str, Lease] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)
    bound: int | None = None
    ids: itertools.count[int] = field(default_factory=itertools.count)

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
        lease = self.grant(dict(options.get("labels") or {}), options.get("policy_version"))
        files = {f"{t.cwd}/{t.path}": f"head\n{t.broken}\ntail\n" for t in self.tasks}
        try:
            yield FakeSandbox(lease, files, self.evaluate_seconds)
        finally:
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
