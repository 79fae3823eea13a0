"""The reference async loop through the gateway: actors lease a sandbox per episode, a learner trains.

Actors and the learner run concurrently (asyncio here; separate Deployments in the chart share the
same classes). An actor takes the newest weights it has (the weight sync), leases a sandbox for
its policy version, reads the broken file, chooses an edit, writes it, and gets the reward from the
package's own tests through `evaluate`. The learner consumes trajectories as they arrive, corrects
for policy lag (staleness drops, truncated importance weights), updates, and publishes each new
version to the gateway, which then refuses acquires that fall too far behind.

The policy is a softmax over candidate edits, so "generation" takes no time by itself;
`think_seconds` stands in for an LLM's generation latency so the profile has the shape of a real
run (it is reported as the `generate` phase, and the gateway sees it as idle time on the lease).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sandfleet.client import AsyncFleet, NotFound, PolicyConflict, SpanReport
from sandfleet.core.profile import percentile
from sandfleet.rl.policy import SoftmaxPolicy, Trajectory, UpdateStats
from sandfleet.rl.tasks import TASKS, Task, apply_edit


@dataclass
class LoopConfig:
    """How a run is shaped."""

    run: str = "demo"
    pool: str = "default"
    actors: int = 2
    duration_seconds: float = 60.0
    batch_size: int = 4
    staleness_bound: int = 4
    mode: str = "refuse"
    think_seconds: float = 0.2
    learning_rate: float = 1.0
    clip: float = 2.0
    seed: int = 0
    tasks: tuple[Task, ...] = TASKS


@dataclass
class LoopStats:
    """What a run did, for the summary and the plots."""

    episodes: int = 0
    refused: int = 0
    errors: list[str] = field(default_factory=list)
    lease_seconds: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)  # per episode, in completion order
    updates: list[UpdateStats] = field(default_factory=list)
    dropped_stale: int = 0
    probabilities_correct: dict[str, float] = field(default_factory=dict)

    def lease_percentiles(self) -> dict[str, float]:
        return {f"p{q}": percentile(self.lease_seconds, q) for q in (50, 90, 99)}


class Learner:
    """Consumes trajectories asynchronously, corrects for lag, updates, publishes versions."""

    def __init__(self, fleet: AsyncFleet, config: LoopConfig, stats: LoopStats) -> None:
        self.fleet = fleet
        self.config = config
        self.stats = stats
        self.policy = SoftmaxPolicy({t.name: len(t.candidates) for t in config.tasks}, seed=config.seed)
        self.published = self.policy.snapshot()
        self.inbox: asyncio.Queue[Trajectory] = asyncio.Queue()

    async def start(self) -> None:
        """Publish the starting version; a run that exists already continues its numbering."""
        try:
            current = int((await self.fleet.policy(self.config.run))["version"])
        except NotFound:
            current = 0
        self.policy.version = current
        self.published = self.policy.snapshot()
        await self.fleet.publish_policy(
            self.config.run, current, self.config.staleness_bound, self.config.mode
        )

    def weights(self) -> SoftmaxPolicy:
        """The newest published weights (actors call this at the start of each episode)."""
        return self.published

    async def run(self, stop: asyncio.Event) -> None:
        while not (stop.is_set() and self.inbox.empty()):
            batch = await self._batch(stop)
            if batch:
                await self.step(batch)

    async def _batch(self, stop: asyncio.Event) -> list[Trajectory]:
        batch: list[Trajectory] = []
        while len(batch) < self.config.batch_size:
            try:
                batch.append(await asyncio.wait_for(self.inbox.get(), timeout=0.5))
            except TimeoutError:
                if stop.is_set():
                    break
        return batch

    async def step(self, batch: list[Trajectory]) -> UpdateStats:
        started = time.time()
        update = self.policy.update(
            batch, self.config.staleness_bound, self.config.learning_rate, self.config.clip
        )
        trained = time.time()
        if update.used:
            await self.fleet.publish_policy(self.config.run, self.policy.version)
            self.published = self.policy.snapshot()
        synced = time.time()
        self.stats.updates.append(update)
        self.stats.dropped_stale += update.dropped_stale
        await self.fleet.report_spans(
            self.config.run,
            [
                SpanReport("train", started, trained, "learner", "learner"),
                SpanReport("weight_sync", trained, synced, "learner", "learner"),
            ],
            dropped_stale=update.dropped_stale,
        )
        return update


class Actor:
    """Runs episodes one after another: one leased sandbox per episode."""

    def __init__(
        self,
        name: str,
        fleet: AsyncFleet,
        config: LoopConfig,
        weights: Callable[[], SoftmaxPolicy],
        send: Callable[[Trajectory], None],
        stats: LoopStats,
    ) -> None:
        self.name = name
        self.fleet = fleet
        self.config = config
        self.weights = weights
        self.send = send
        self.stats = stats
        self.rng = np.random.default_rng([config.seed, *name.encode()])

    async def run(self, stop: asyncio.Event) -> None:
        episode = 0
        while not stop.is_set():
            task = self.config.tasks[int(self.rng.integers(len(self.config.tasks)))]
            try:
                await self.episode(task, f"{self.name}-{episode}")
            except PolicyConflict:
                self.stats.refused += 1  # too stale for the run: take fresh weights and go again
            except Exception as error:  # one failed episode must not end the actor
                self.stats.errors.append(f"{self.name}: {type(error).__name__}: {error}")
                await asyncio.sleep(0.5)
            episode += 1

    async def episode(self, task: Task, episode: str) -> Trajectory:
        policy = self.weights()  # weight sync: whatever the learner published last
        spans: list[SpanReport] = []

        def span(phase: str, start: float) -> float:
            now = time.time()
            spans.append(SpanReport(phase, start, now, "actor", self.name))
            return now

        t = time.time()
        labels = {"run": self.config.run, "episode": episode, "task": task.name}
        async with self.fleet.lease(
            self.config.pool, labels=labels, policy_version=policy.version, wait_seconds=60
        ) as sandbox:
            t = span("sandbox_wait", t)
            self.stats.lease_seconds.append(spans[-1].end - spans[-1].start)
            path = f"{task.cwd}/{task.path}"
            source = (await sandbox.read_file(path)).decode()
            t = span("tool", t)
            action, logp = policy.sample(task.name, self.rng)
            await asyncio.sleep(self.config.think_seconds)
            t = span("generate", t)
            await sandbox.write_file(path, apply_edit(source, task.broken, task.candidates[action]))
            t = span("tool", t)
            result = await sandbox.evaluate(shell=task.test_command, cwd=task.cwd, timeout_s=120)
            t = span("score", t)
        reward = float(result.get("reward", 0.0))
        trajectory = Trajectory(task.name, action, logp, reward, policy.version, self.name)
        self.send(trajectory)
        self.stats.episodes += 1
        self.stats.rewards.append(reward)
        await self.fleet.report_spans(self.config.run, spans)
        return trajectory


async def run_loop(
    fleet: AsyncFleet, config: LoopConfig, progress: Callable[[LoopStats], None] | None = None
) -> tuple[LoopStats, Learner]:
    """Run `config.actors` actors and one learner for `config.duration_seconds`; release the run after."""
    stats = LoopStats()
    learner = Learner(fleet, config, stats)
    await learner.start()
    stop = asyncio.Event()
    actors = [
        Actor(f"actor-{i}", fleet, config, learner.weights, learner.inbox.put_nowait, stats)
        for i in range(config.actors)
    ]
    tasks = [asyncio.create_task(a.run(stop)) for a in actors]
    learning = asyncio.create_task(learner.run(stop))
    deadline = time.monotonic() + config.duration_seconds
    try:
        while time.monotonic() < deadline:
            await asyncio.sleep(min(5.0, max(deadline - time.monotonic(), 0.0)))
            if progress is not None:
                progress(stats)
        stop.set()
        await asyncio.gather(*tasks)
        await learning
    finally:
        stop.set()
        for task in [*tasks, learning]:
            task.cancel()
        await asyncio.gather(*tasks, learning, return_exceptions=True)
        await fleet.release_run(config.run)
    stats.probabilities_correct = {
        t.name: float(learner.policy.probabilities(t.name)[t.correct]) for t in config.tasks
    }
    return stats, learner


def reward_curve(stats: LoopStats, points: int = 20) -> list[float]:
    """Mean reward over consecutive slices of the episodes (the curve the summary prints)."""
    rewards = stats.rewards
    if not rewards:
        return []
    size = max(len(rewards) // points, 1)
    return [float(np.mean(rewards[i : i + size])) for i in range(0, len(rewards), size)]
