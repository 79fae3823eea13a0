"""An in-process warm pool: N sandboxes kept ready so a lease on a laptop is as fast as on a cluster."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable

from sandfleet.core.warm_pool import PoolCounts, plan_warm_step
from sandfleet.local.errors import LocalRuntimeError
from sandfleet.local.runtime import LocalRuntime, RunscSandbox, SandboxSpec

log = logging.getLogger(__name__)


class WarmPool:
    """Keeps `size` ready sandboxes of one spec; the backend takes the one it hands out, and it refills."""

    def __init__(
        self,
        runtime: LocalRuntime,
        size: int,
        *,
        spec: SandboxSpec | None = None,
        max_parallel_creates: int = 2,
        on_ready: Callable[[RunscSandbox], None] | None = None,
        on_retire: Callable[[RunscSandbox], None] | None = None,
        create: Callable[[SandboxSpec], Awaitable[RunscSandbox]] | None = None,
    ) -> None:
        if size < 0:
            raise ValueError("pool size must not be negative")
        self.runtime = runtime
        self.spec = spec or SandboxSpec()
        self.size = size
        self.max_parallel_creates = max_parallel_creates
        self.on_ready = on_ready  # told of each sandbox as it joins the ready set
        self.on_retire = on_retire  # told of each ready sandbox destroyed because the pool shrank
        # How a sandbox is made: booted, or restored from a golden snapshot (a recycling pool).
        self.create = create or runtime.create
        self.failures = 0
        self._ready: deque[RunscSandbox] = deque()
        self._creating: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self._closed = False

    @property
    def ready_count(self) -> int:
        """Sandboxes ready to hand out now."""
        return len(self._ready)

    @property
    def creating_count(self) -> int:
        """Sandboxes being created now (refills on their way)."""
        return len(self._creating)

    def start(self) -> None:
        """Begin filling the pool in the background."""
        self._refill()

    def resize(self, size: int) -> None:
        """Change the target; surplus ready sandboxes are destroyed in the background."""
        if size < 0:
            raise ValueError("pool size must not be negative")
        self.size = size
        self._refill()

    def take(self, sandbox: RunscSandbox) -> bool:
        """Take this ready sandbox out of the pool (False if it is no longer there); refills."""
        try:
            self._ready.remove(sandbox)
        except ValueError:
            return False
        self._refill()
        return True

    def put_back(self, sandbox: RunscSandbox) -> None:
        """Return a sandbox taken with `take` but never used: it is ready again, first in line.

        No refill here: retiring the surplus now would destroy a sandbox its owner still lists as
        warm; the next take evens the count out.
        """
        self._ready.appendleft(sandbox)
        self._changed.set()

    async def wait_full(self, timeout_s: float = 60.0) -> None:
        """Wait until the pool holds its target of ready sandboxes."""
        deadline = time.monotonic() + timeout_s
        while len(self._ready) < self.size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LocalRuntimeError(
                    f"the pool has {len(self._ready)} of {self.size} sandboxes ready after {timeout_s:.0f} s"
                )
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                continue

    async def close(self) -> None:
        """Stop refilling, and destroy ready sandboxes and those being created."""
        self._closed = True
        for task in list(self._creating):
            task.cancel()
        if self._creating:
            await asyncio.gather(*self._creating, return_exceptions=True)
        while self._ready:
            self.runtime.release(self._ready.popleft())

    def _refill(self) -> None:
        if self._closed:
            return
        step = plan_warm_step(
            PoolCounts(
                ready=len(self._ready),
                creating=len(self._creating),
                target=self.size,
                max_parallel_creates=self.max_parallel_creates,
            )
        )
        for _ in range(step.create):
            task = asyncio.get_running_loop().create_task(self._create_one())
            self._creating.add(task)
        for _ in range(step.retire):
            retired = self._ready.pop()
            # Whoever was told it is ready must hear it is gone, or it keeps counting it as warm.
            if self.on_retire is not None:
                self.on_retire(retired)
            self.runtime.release(retired)

    async def _create_one(self) -> None:
        task = asyncio.current_task()
        try:
            sandbox = await self.create(self.spec)
        except LocalRuntimeError as error:
            self.failures += 1
            log.warning("warm pool create failed: %s", error)
            # Back off before the next attempt so a broken image does not spin.
            await asyncio.sleep(min(0.5 * self.failures, 5.0))
        else:
            if self._closed:
                self.runtime.release(sandbox)
            else:
                self._ready.append(sandbox)
                if self.on_ready is not None:
                    self.on_ready(sandbox)
        finally:
            if task is not None:
                self._creating.discard(task)
            self._changed.set()
        self._refill()
