"""Run an async test on virtual time: timers fire in their order, and idle time costs nothing.

The loop's clock (`loop.time()`, which `asyncio.sleep`, `asyncio.wait_for` and `call_later` use)
starts at a fixed value and moves only when the loop has nothing ready to run: then it jumps to the
next timer instead of sleeping until it is due. A test's sleeps and deadlines are therefore exact,
however loaded the machine is: a stalled process delays the run, never the order of its events.
Hand the service the same clock (`LeaseService(backend, clock=loop.time)`) to age its waiters on it.

Only for code that waits on timers alone: readiness of real I/O or of threads is polled, never
waited for, so virtual time runs ahead of them.
"""

from __future__ import annotations

import asyncio
import functools
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec

P = ParamSpec("P")

START = 1000.0  # not zero: a time of zero reads as "unknown" to some of the code under test


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose clock skips ahead over idle time."""

    def __init__(self) -> None:
        self._virtual_now = START
        super().__init__(_SkipsIdleTime(self))

    def time(self) -> float:
        return self._virtual_now

    def _skip(self, seconds: float) -> None:
        self._virtual_now += seconds


class _SkipsIdleTime(selectors.DefaultSelector):
    """Polls instead of blocking, and moves the loop's clock on by the time it would have blocked."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer at all: only I/O can wake the loop, as on a real one
            return super().select(None)
        self._loop._skip(timeout)  # nothing to do before the next timer: it is due now
        return []


def on_virtual_time(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """Run the async test (fixtures still injected) on a fresh VirtualTimeLoop of its own."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
            runner.run(test(*args, **kwargs))

    return run
