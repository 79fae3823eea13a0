"""A warm pool that shrinks tells its owner which ready sandboxes it destroyed (no runsc needed)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

from sandfleet.core.limits import SandboxLimits
from sandfleet.local.pool import WarmPool
from sandfleet.local.runtime import RunscSandbox


class FakeRuntime:
    def __init__(self) -> None:
        self.ids = itertools.count()
        self.released: list[str] = []

    async def create(self, spec: Any = None) -> RunscSandbox:
        await asyncio.sleep(0)
        n = next(self.ids)
        return RunscSandbox(f"sb{n}", n, "127.0.0.1", 9000 + n, Path("/nonexistent"), SandboxLimits())

    def release(self, sandbox: RunscSandbox) -> None:
        self.released.append(sandbox.id)


async def test_a_shrinking_pool_reports_every_sandbox_it_retires() -> None:
    runtime = FakeRuntime()
    ready: set[str] = set()
    pool = WarmPool(
        runtime,  # type: ignore[arg-type]
        3,
        on_ready=lambda s: ready.add(s.id),
        on_retire=lambda s: ready.discard(s.id),
    )
    pool.start()
    await pool.wait_full(timeout_s=5)
    assert len(ready) == 3
    pool.resize(1)  # a prefetch ran out
    assert pool.ready_count == 1
    assert len(ready) == 1  # before: the owner still counted 3 warm, 2 of them destroyed
    assert set(runtime.released) | ready == {"sb0", "sb1", "sb2"}
    await pool.close()
