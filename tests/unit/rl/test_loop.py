"""The loop's Actor and Learner over an in-memory fleet: in one process, with shutdown and drains."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from sandfleet.client import AsyncFleet, Forbidden, SandboxLost
from sandfleet.rl.catalogue_tasks import load_tasks
from sandfleet.rl.loop import Actor, Learner, LearnerClosed, LocalLink, LoopConfig, LoopStats, run_loop
from sandfleet.rl.policy import Trajectory
from sandfleet.rl.processes import release_own_leases, run_actors, stop_after
from tests.unit.rl.fakes import FakeFleet

TASK = load_tasks()[0]  # the default catalogue's (tasks/ci.yaml)


def as_fleet(fake: FakeFleet) -> AsyncFleet:
    return cast(AsyncFleet, fake)


async def test_run_loop_shares_the_actor_and_learner_and_trains_on_every_episode() -> None:
    fake = FakeFleet()
    config = LoopConfig(run="r", actors=2, duration_seconds=1.0, batch_size=2, think_seconds=0.01)
    stats, learner = await run_loop(as_fleet(fake), config)
    assert stats.episodes >= 4, stats.errors
    assert not stats.errors
    assert learner.received == stats.episodes  # the last trajectories were trained on, not refused
    assert learner.inbox.empty()
    assert set(learner.by_actor) == {"actor-0", "actor-1"}
    assert fake.published[0] == 0
    assert fake.published[-1] == learner.policy.version >= 1
    assert not fake.live  # every lease released
    phases = {s.phase for s in fake.spans}
    assert {"sandbox_wait", "tool", "generate", "score", "train", "weight_sync"} <= phases


async def test_a_learner_continues_the_runs_numbering() -> None:
    fake = FakeFleet(published=[7])
    learner = Learner(as_fleet(fake), LoopConfig(run="r"), LoopStats())
    await learner.start()
    assert learner.weights().version == 7
    assert fake.published == [7, 7]
    assert fake.bound == 4


async def test_stopping_the_learner_drains_refuses_and_publishes_the_last_version() -> None:
    fake = FakeFleet()
    config = LoopConfig(run="r", batch_size=100)  # never a full batch: only the drain trains
    learner = Learner(as_fleet(fake), config, LoopStats())
    await learner.start()
    for _ in range(3):
        learner.submit(Trajectory(TASK.id, TASK.correct_choice, -0.693, 1.0, 0, "a"))
    stop = asyncio.Event()
    running = asyncio.create_task(learner.run(stop))
    await asyncio.sleep(0.05)
    stop.set()
    await running
    assert learner.inbox.empty()
    assert learner.weights().version == 1 == fake.published[-1]
    assert learner.summary()["received"] == 3
    with pytest.raises(LearnerClosed, match="shutting down"):
        learner.submit(Trajectory(TASK.id, TASK.correct_choice, -0.693, 1.0, 0, "a"))


async def test_a_full_inbox_pushes_back() -> None:
    learner = Learner(as_fleet(FakeFleet()), LoopConfig(), LoopStats(), inbox_limit=1)
    learner.submit(Trajectory(TASK.id, 0, -1.0, 0.0, 0))
    with pytest.raises(LearnerClosed, match="full"):
        learner.submit(Trajectory(TASK.id, 0, -1.0, 0.0, 0))


async def test_an_episode_rewards_the_fix_and_labels_its_lease_with_the_actor() -> None:
    fake = FakeFleet()
    config = LoopConfig(run="r", think_seconds=0.0)
    learner = Learner(as_fleet(fake), config, LoopStats())
    await learner.start()
    stats = LoopStats()
    actor = Actor("a0", as_fleet(fake), config, LocalLink(learner), stats)
    rewards = set()
    for index in range(20):
        task = config.tasks[index % len(config.tasks)]
        trajectory = await actor.episode(task, f"e{index}")
        assert trajectory is not None  # the fake fleet never fails an episode unless told to
        rewards.add(trajectory.reward)
        assert trajectory.reward == float(task.choices[trajectory.action] == task.original)
    assert rewards == {0.0, 1.0}
    assert learner.received == stats.episodes == 20


async def test_actors_stop_within_the_grace_and_release_their_leases() -> None:
    fake = FakeFleet(evaluate_seconds=10.0)  # an episode that will not finish in the grace
    config = LoopConfig(run="r", think_seconds=0.0)
    learner = Learner(as_fleet(fake), config, LoopStats())
    await learner.start()
    stop = asyncio.Event()
    stopper = asyncio.create_task(stop_after(stop, 0.2))
    started = asyncio.get_running_loop().time()
    stats = await run_actors(
        as_fleet(fake), config, LocalLink(learner), ["a0", "a1"], stop, grace_seconds=0.2
    )
    await stopper
    assert asyncio.get_running_loop().time() - started < 2.0
    assert stats.episodes == 0
    assert not fake.live
    assert len(fake.released) == 2  # both in-flight leases, released by the cancelled episodes


async def test_release_own_leases_leaves_other_actors_alone() -> None:
    fake = FakeFleet()
    mine = fake.grant({"run": "r", "actor": "a0"}, 0)
    theirs = fake.grant({"run": "r", "actor": "b0"}, 0)
    assert await release_own_leases(as_fleet(fake), "r", ["a0"]) == [mine.id]
    assert list(fake.live) == [theirs.id]


async def test_an_infra_error_is_masked_and_a_time_out_is_a_counted_zero() -> None:
    fake = FakeFleet(
        outcomes=[
            {"outcome": "infra_error", "reward": 0.0, "outcome_reason": "the verifier wrote no report"},
            {"outcome": "timed_out", "reward": 0.0, "outcome_reason": "killed"},
        ]
    )
    config = LoopConfig(run="r", think_seconds=0.0, tasks=(TASK,))
    learner = Learner(as_fleet(fake), config, LoopStats())
    await learner.start()
    stats = LoopStats()
    actor = Actor("a0", as_fleet(fake), config, LocalLink(learner), stats)
    assert await actor.episode(TASK, "e0") is None
    assert learner.received == stats.episodes == 0  # never a fake zero for the learner
    assert stats.infra_errors == 1
    assert "the verifier wrote no report" in stats.infra_reasons[0]
    timed_out = await actor.episode(TASK, "e1")
    assert timed_out is not None
    assert timed_out.reward == 0.0
    assert stats.timed_out == 1
    assert learner.received == stats.episodes == 1
    assert stats.rewards == [0.0]
    assert not fake.live  # both leases released


async def test_an_episode_is_scored_by_its_tasks_deciding_tests_and_never_sees_the_hidden_ones() -> None:
    hidden = {"tests/test_hidden.py": "def test_x(): pass\n"}
    task = TASK.model_copy(update={"hidden_tests": hidden})
    fake = FakeFleet(tasks=[task])
    config = LoopConfig(run="r", think_seconds=0.0, tasks=(task,))
    learner = Learner(as_fleet(fake), config, LoopStats())
    await learner.start()
    await Actor("a0", as_fleet(fake), config, LocalLink(learner), LoopStats()).episode(task, "e0")
    (body,) = fake.evaluated
    assert body == {"task": task.scoring()}
    assert body["task"]["files"] == hidden  # the hidden tests travel only in it, to the scoring tree


async def test_a_fleet_failure_before_scoring_counts_as_infra_and_a_refusal_as_an_error() -> None:
    fake = FakeFleet(
        lease_failures=[
            SandboxLost(502, "sandbox_lost", "the agent stopped answering"),
            Forbidden(403, "forbidden", "not your pool"),
        ]
    )
    # A little think time bounds the episodes: with none, a fast machine ran 10,000 in 1.5 s and
    # filled the learner's inbox, an error of its own.
    config = LoopConfig(run="r", think_seconds=0.001, batch_size=100)
    learner = Learner(as_fleet(fake), config, LoopStats())
    await learner.start()
    stop = asyncio.Event()
    stopper = asyncio.create_task(stop_after(stop, 1.5))  # two failures (0.5 s apart), then episodes
    stats = await run_actors(as_fleet(fake), config, LocalLink(learner), ["a0"], stop, grace_seconds=1.0)
    await stopper
    assert stats.infra_errors == 1
    assert "SandboxLost" in stats.infra_reasons[0]
    assert len(stats.errors) == 1
    assert "Forbidden" in stats.errors[0]
    assert stats.episodes >= 1
    assert learner.received == stats.episodes  # the failed episodes sent nothing


async def test_a_step_runs_its_episodes_on_one_batch_and_sends_each_trajectory() -> None:
    fake = FakeFleet(batch_limit=3)  # the pool had 3 of the 4 warm within the batch's wait
    config = LoopConfig(run="r", think_seconds=0.0, episodes_per_step=4, batch_wait_seconds=2.5)
    learner = Learner(as_fleet(fake), config, LoopStats())
    await learner.start()
    stats = LoopStats()
    actor = Actor("a0", as_fleet(fake), config, LocalLink(learner), stats)
    trajectories = await actor.step(TASK, "a0-0")
    assert len(trajectories) == 3  # as many episodes as the batch had sandboxes
    assert all(t is not None and t.task == TASK.id for t in trajectories)
    (asked,) = fake.batches
    assert (asked["count"], asked["min_count"], asked["wait_seconds"]) == (4, 1, 2.5)
    assert asked["labels"] == {"run": "r", "episode": "a0-0", "task": TASK.id, "actor": "a0"}
    assert learner.received == stats.episodes == 3
    assert len(fake.released) == 3
    assert not fake.live
    assert sum(s.phase == "sandbox_wait" for s in fake.spans) == 3  # each episode's wait reported


async def test_an_actor_with_episodes_per_step_leases_batches_until_stopped() -> None:
    fake = FakeFleet()
    config = LoopConfig(run="r", think_seconds=0.0, episodes_per_step=2)
    learner = Learner(as_fleet(fake), config, LoopStats())
    await learner.start()
    stop = asyncio.Event()
    stopper = asyncio.create_task(stop_after(stop, 0.3))
    stats = await run_actors(as_fleet(fake), config, LocalLink(learner), ["a0"], stop)
    await stopper
    assert fake.batches
    assert stats.episodes == 2 * len(fake.batches), stats.errors
    assert not fake.live
