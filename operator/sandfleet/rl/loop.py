"""The reference async loop through the gateway: actors lease a sandbox per episode, a learner trains.

Actors and the learner run concurrently: in one process (`run_loop`, the demo: actors hand
trajectories to the learner through a `LocalLink`) or as separate processes (`sandfleet rl learner`
and `sandfleet rl actor`, the chart's Deployments: a `transport.LearnerClient` over the learner's
HTTP endpoint). Both paths run these same `Actor` and `Learner` classes.

An actor takes the newest weights it has (the weight sync), leases a sandbox for its policy
version, reads the broken file, chooses an edit, writes it, and gets the reward from the package's
own tests through `evaluate` (the tasks come from a catalogue: `sandfleet.rl.catalogue_tasks`). With
`episodes_per_step` above 1 an actor's step is that many samples of one task, run at once on the
sandboxes of one batch acquire (up to that many, at least one, within `batch_wait_seconds`). An episode
the fleet failed (`infra_error`, a lease or transport failure) never reaches the learner as a zero
reward: it is dropped and counted (`sandfleet.rl.outcomes`). The learner consumes trajectories as
they arrive, corrects for policy lag (staleness drops, truncated importance weights), updates, and
publishes each new version to the gateway, which then refuses acquires that fall too far behind.

The policy is a softmax over candidate edits, so "generation" takes no time by itself;
`think_seconds` stands in for an LLM's generation latency so the profile has the shape of a real
run (it is reported as the `generate` phase, and the gateway sees it as idle time on the lease).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from sandfleet.client import (
    AsyncFleet,
    AsyncSandbox,
    Evaluation,
    NotFound,
    PolicyConflict,
    SpanReport,
)
from sandfleet.core.profile import percentile
from sandfleet.rl.catalogue_tasks import apply_edit, load_tasks
from sandfleet.rl.outcomes import is_infrastructure, training_decision
from sandfleet.rl.policy import Array, SoftmaxPolicy, Trajectory, UpdateStats
from sandfleet.tasks.catalogue import Task
from sandfleet.wire import Outcome, PolicyMode


@dataclass
class LoopConfig:
    """How a run is shaped."""

    run: str = "demo"
    pool: str = "default"
    actors: int = 2
    duration_seconds: float = 60.0
    batch_size: int = 4
    staleness_bound: int = 4
    mode: PolicyMode = "refuse"  # beyond the staleness bound: refuse the acquire, or flag it
    think_seconds: float = 0.2
    learning_rate: float = 1.0
    clip: float = 2.0
    seed: int = 0
    tasks: tuple[Task, ...] = field(default_factory=load_tasks)
    episodes_per_step: int = 1  # above 1: an actor's step leases them as one batch
    batch_wait_seconds: float = 5.0  # how long a step's batch waits for all of them before it runs


@dataclass
class LoopStats:
    """What a run did, for the summary and the plots."""

    episodes: int = 0  # episodes whose trajectory went to the learner
    refused: int = 0
    errors: list[str] = field(default_factory=list)
    infra_errors: int = 0  # episodes the fleet failed: dropped, never trained on as a zero
    infra_reasons: list[str] = field(default_factory=list)
    timed_out: int = 0  # episodes whose tests ran past their timeout (reward 0, trained on)
    lease_seconds: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)  # per episode, in completion order
    updates: list[UpdateStats] = field(default_factory=list)
    dropped_stale: int = 0
    probabilities_correct: dict[str, float] = field(default_factory=dict)

    def lease_percentiles(self) -> dict[str, float]:
        return {f"p{q}": percentile(self.lease_seconds, q) for q in (50, 90, 99)}


class LearnerClosed(RuntimeError):
    """The learner is shutting down (or its inbox is full) and takes no more trajectories."""


class TrainablePolicy(Protocol):
    """What the learner trains: the numpy `SoftmaxPolicy` or the torch one (`sandfleet.rl.torch_policy`)."""

    version: int

    def probabilities(self, task: str) -> Array: ...

    def snapshot(self) -> SoftmaxPolicy: ...

    def update(
        self, batch: Sequence[Trajectory], staleness_bound: int, learning_rate: float, clip: float
    ) -> UpdateStats: ...


class Learner:
    """Consumes trajectories asynchronously, corrects for lag, updates, publishes versions."""

    def __init__(
        self,
        fleet: AsyncFleet,
        config: LoopConfig,
        stats: LoopStats,
        policy: TrainablePolicy | None = None,
        inbox_limit: int = 10_000,
    ) -> None:
        self.fleet = fleet
        self.config = config
        self.stats = stats
        self.policy: TrainablePolicy = policy or SoftmaxPolicy(
            {t.id: len(t.choices) for t in config.tasks}, seed=config.seed
        )
        self.published = self.policy.snapshot()
        # Bounded so a learner that falls behind pushes back (429) instead of growing without limit.
        self.inbox: asyncio.Queue[Trajectory] = asyncio.Queue(maxsize=inbox_limit)
        self.closed = False
        self.received = 0
        self.received_rewards: list[float] = []
        self.by_actor: Counter[str] = Counter()

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

    def submit(self, trajectory: Trajectory) -> None:
        """Queue a trajectory for training; LearnerClosed once stopping (or when the inbox is full)."""
        if self.closed:
            raise LearnerClosed("the learner is shutting down")
        try:
            self.inbox.put_nowait(trajectory)
        except asyncio.QueueFull:
            raise LearnerClosed(f"the learner's inbox is full ({self.inbox.maxsize})") from None
        self.received += 1
        self.received_rewards.append(trajectory.reward)
        self.by_actor[trajectory.actor] += 1

    async def run(self, stop: asyncio.Event) -> None:
        """Train until `stop`; then take no more, train on what is queued, publish the last version."""
        while not stop.is_set():
            batch = await self._batch(stop)
            if batch:
                await self.step(batch)
        self.closed = True
        while not self.inbox.empty():
            await self.step([self.inbox.get_nowait() for _ in range(min(self.inbox.qsize(), 64))])
        # Republishing is idempotent; it makes sure the gateway ends on the version actors last saw.
        await self.fleet.publish_policy(self.config.run, self.published.version)

    async def _batch(self, stop: asyncio.Event) -> list[Trajectory]:
        batch: list[Trajectory] = []
        while len(batch) < self.config.batch_size and not stop.is_set():
            try:
                batch.append(await asyncio.wait_for(self.inbox.get(), timeout=0.5))
            except TimeoutError:
                continue
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

    def summary(self) -> dict[str, Any]:
        """What the learner has seen and done (the endpoint's /v1/stats; the process's last line)."""
        recent = self.received_rewards[-20:]
        return {
            "run": self.config.run,
            "version": self.published.version,
            "received": self.received,
            "by_actor": dict(self.by_actor),
            "queued": self.inbox.qsize(),
            "learner_steps": len(self.stats.updates),
            "dropped_stale": self.stats.dropped_stale,
            "mean_reward": sum(self.received_rewards) / len(self.received_rewards)
            if self.received_rewards
            else 0.0,
            "mean_reward_last_20": sum(recent) / len(recent) if recent else 0.0,
            "probabilities_correct": {
                t.id: float(self.policy.probabilities(t.id)[t.correct_choice]) for t in self.config.tasks
            },
        }


class PolicyLink(Protocol):
    """How an actor reaches its learner: in this process (`LocalLink`) or over HTTP (`LearnerClient`)."""

    async def weights(self) -> SoftmaxPolicy:
        """The newest weights the learner has published (the weight sync)."""
        ...

    async def send(self, trajectory: Trajectory) -> None:
        """Hand a finished episode to the learner."""
        ...


class LocalLink:
    """Actors and the learner in one process: the learner's inbox is an asyncio.Queue."""

    def __init__(self, learner: Learner) -> None:
        self.learner = learner

    async def weights(self) -> SoftmaxPolicy:
        return self.learner.weights()

    async def send(self, trajectory: Trajectory) -> None:
        self.learner.submit(trajectory)


@dataclass(frozen=True)
class _Played:
    """An episode as it left its sandbox: the action taken, its log-probability, the score, the spans."""

    action: int
    logp: float
    result: Evaluation
    spans: list[SpanReport]


class Actor:
    """Runs episodes one after another (one leased sandbox each), or steps of them (one batch each)."""

    def __init__(
        self,
        name: str,
        fleet: AsyncFleet,
        config: LoopConfig,
        link: PolicyLink,
        stats: LoopStats,
        wait_seconds: float = 60.0,
    ) -> None:
        self.name = name
        self.fleet = fleet
        self.config = config
        self.link = link
        self.stats = stats
        self.wait_seconds = wait_seconds
        self.rng = np.random.default_rng([config.seed, *name.encode()])

    async def run(self, stop: asyncio.Event) -> None:
        """Episodes until `stop` (checked between episodes: one in flight finishes and is sent)."""
        episode = 0
        while not stop.is_set():
            task = self.config.tasks[int(self.rng.integers(len(self.config.tasks)))]
            try:
                if self.config.episodes_per_step > 1:
                    await self.step(task, f"{self.name}-{episode}")
                else:
                    await self.episode(task, f"{self.name}-{episode}")
            except PolicyConflict:
                self.stats.refused += 1  # too stale for the run: take fresh weights and go again
            except Exception as error:  # one failed episode must not end the actor
                self._failed(error)
                await asyncio.sleep(0.5)
            episode += 1

    def _failed(self, error: BaseException) -> None:
        failure = f"{self.name}: {type(error).__name__}: {error}"
        if is_infrastructure(error):
            self.stats.infra_errors += 1
            self.stats.infra_reasons.append(failure)
        else:
            self.stats.errors.append(failure)

    def _labels(self, task: Task, episode: str) -> dict[str, str]:
        # The actor label lets a stopping actor find (and release) a lease it may not have heard of.
        return {"run": self.config.run, "episode": episode, "task": task.id, "actor": self.name}

    async def episode(self, task: Task, episode: str) -> Trajectory | None:
        """One episode; its trajectory once sent to the learner, None if the fleet failed it."""
        policy = await self.link.weights()  # weight sync: whatever the learner published last
        started = time.time()
        async with self.fleet.lease(
            self.config.pool,
            labels=self._labels(task, episode),
            policy_version=policy.version,
            wait_seconds=self.wait_seconds,
        ) as sandbox:
            played = await self._play(sandbox, task, policy, started)
        return await self._finish(task, policy, played)

    async def step(self, task: Task, step: str) -> list[Trajectory | None]:
        """`episodes_per_step` samples of `task` on one batch of sandboxes; each one's trajectory.

        The batch is granted when all are leased or at the end of `batch_wait_seconds` with at
        least one, so a step runs as many episodes as there were sandboxes for it; an episode that
        fails is counted as a lone episode's failure would be, and the others go on.
        """
        policy = await self.link.weights()
        started = time.time()
        async with self.fleet.batch(
            self.config.pool,
            self.config.episodes_per_step,
            min_count=1,
            labels=self._labels(task, step),
            policy_version=policy.version,
            wait_seconds=self.config.batch_wait_seconds,
        ) as sandboxes:
            played = await asyncio.gather(
                *(self._play(sandbox, task, policy, started) for sandbox in sandboxes),
                return_exceptions=True,
            )
        trajectories: list[Trajectory | None] = []
        for outcome in played:
            if isinstance(outcome, asyncio.CancelledError):
                raise outcome
            if isinstance(outcome, BaseException):
                self._failed(outcome)
                trajectories.append(None)
            else:
                trajectories.append(await self._finish(task, policy, outcome))
        return trajectories

    async def _play(
        self, sandbox: AsyncSandbox, task: Task, policy: SoftmaxPolicy, started: float
    ) -> _Played:
        """Act in a leased sandbox and score it; `started` is when its acquire began."""
        spans: list[SpanReport] = []

        def span(phase: str, start: float) -> float:
            now = time.time()
            spans.append(SpanReport(phase, start, now, "actor", self.name))
            return now

        t = span("sandbox_wait", started)
        self.stats.lease_seconds.append(spans[-1].end - spans[-1].start)
        source = (await sandbox.read_file(task.bug_path)).decode()
        t = span("tool", t)
        action, logp = policy.sample(task.id, self.rng)
        await asyncio.sleep(self.config.think_seconds)
        t = span("generate", t)
        await sandbox.write_file(task.bug_path, apply_edit(source, task.broken, task.choices[action]))
        t = span("tool", t)
        # The task's deciding tests, run from its own copy with the edit carried over (hidden tests
        # are written only there: the policy never sees them).
        result = await sandbox.score(task=task.scoring())
        t = span("score", t)
        return _Played(action, logp, result, spans)

    async def _finish(self, task: Task, policy: SoftmaxPolicy, played: _Played) -> Trajectory | None:
        """Report an episode's spans and send its trajectory; None (counted) if the fleet failed it."""
        action, logp, result = played.action, played.logp, played.result
        await self.fleet.report_spans(self.config.run, played.spans)
        scored = training_decision(result.outcome, result.reward)
        if not scored.train:
            self.stats.infra_errors += 1
            self.stats.infra_reasons.append(f"{self.name}: {task.id}: {result.reason or result.outcome}")
            return None
        if result.outcome is Outcome.TIMED_OUT:
            self.stats.timed_out += 1
        trajectory = Trajectory(task.id, action, logp, scored.reward, policy.version, self.name)
        self.stats.episodes += 1
        self.stats.rewards.append(scored.reward)
        await self.link.send(trajectory)
        return trajectory


async def stop_actors(actors: list[asyncio.Task[None]], grace_seconds: float) -> None:
    """Let episodes in flight finish within the grace; cancel the rest (their leases are released)."""
    if not actors:
        return
    _, pending = await asyncio.wait(actors, timeout=grace_seconds)
    for task in pending:
        task.cancel()  # `fleet.lease` releases the lease on the way out
    await asyncio.gather(*actors, return_exceptions=True)


async def run_loop(
    fleet: AsyncFleet, config: LoopConfig, progress: Callable[[LoopStats], None] | None = None
) -> tuple[LoopStats, Learner]:
    """Run `config.actors` actors and one learner for `config.duration_seconds`; release the run after."""
    stats = LoopStats()
    learner = Learner(fleet, config, stats)
    await learner.start()
    stop, stop_learner = asyncio.Event(), asyncio.Event()
    link = LocalLink(learner)
    actors = [Actor(f"actor-{i}", fleet, config, link, stats) for i in range(config.actors)]
    tasks = [asyncio.create_task(a.run(stop)) for a in actors]
    learning = asyncio.create_task(learner.run(stop_learner))
    deadline = time.monotonic() + config.duration_seconds
    try:
        while time.monotonic() < deadline:
            await asyncio.sleep(min(5.0, max(deadline - time.monotonic(), 0.0)))
            if progress is not None:
                progress(stats)
        stop.set()
        await asyncio.gather(*tasks)
        stop_learner.set()  # after the actors: their last trajectories are trained on, not refused
        await learning
    finally:
        stop.set()
        stop_learner.set()
        for task in [*tasks, learning]:
            task.cancel()
        await asyncio.gather(*tasks, learning, return_exceptions=True)
        await fleet.release_run(config.run)
    stats.probabilities_correct = {
        t.id: float(learner.policy.probabilities(t.id)[t.correct_choice]) for t in config.tasks
    }
    return stats, learner


def reward_curve(stats: LoopStats, points: int = 20) -> list[float]:
    """Mean reward over consecutive slices of the episodes (the curve the summary prints)."""
    rewards = stats.rewards
    if not rewards:
        return []
    size = max(len(rewards) // points, 1)
    return [float(np.mean(rewards[i : i + size])) for i in range(0, len(rewards), size)]
