"""Actor and learner processes (the chart's Deployments): signals, durations, and clean exits.

SIGTERM (Kubernetes stopping a pod) and SIGINT set a stop event. Actors then finish the episode
in flight within a grace period, cancel what is left (the lease context releases its sandbox), and
release any lease of theirs the gateway granted while they were going away. The learner's side is
`sandfleet.rl.service.serve_learner`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterable

from sandfleet.client import AsyncFleet
from sandfleet.rl.loop import Actor, LoopConfig, LoopStats, PolicyLink, stop_actors


def stop_on_signals(stop: asyncio.Event, signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT)) -> None:
    """Set `stop` on these signals (in the running loop)."""
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)


async def stop_after(stop: asyncio.Event, seconds: float) -> None:
    """Set `stop` after `seconds` (0: never; only a signal stops the process)."""
    if seconds > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)
        stop.set()


async def release_own_leases(fleet: AsyncFleet, run: str, names: Iterable[str]) -> list[str]:
    """Release leases of `run` labelled with one of these actors (an acquire cut off by shutdown)."""
    mine = set(names)
    released = []
    for lease in await fleet.leases(run=run):
        if lease.labels.get("actor") in mine and await fleet.release(lease.id):
            released.append(lease.id)
    return released


async def run_actors(
    fleet: AsyncFleet,
    config: LoopConfig,
    link: PolicyLink,
    names: list[str],
    stop: asyncio.Event,
    grace_seconds: float = 30.0,
    wait_seconds: float = 60.0,
    progress: Callable[[LoopStats], None] | None = None,
    progress_seconds: float = 10.0,
) -> LoopStats:
    """Run one `Actor` per name until `stop`; return what they did once every lease is released."""
    stats = LoopStats()
    actors = [Actor(name, fleet, config, link, stats, wait_seconds) for name in names]
    tasks = [asyncio.create_task(actor.run(stop)) for actor in actors]
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), progress_seconds)
            if progress is not None and not stop.is_set():
                progress(stats)
    finally:
        await stop_actors(tasks, grace_seconds)
        with contextlib.suppress(Exception):  # best effort: the lease TTL is the backstop
            await release_own_leases(fleet, config.run, names)
    if progress is not None:
        progress(stats)
    return stats
