"""Loop-phase series per run are bounded: the first N runs, then `other`; ended runs give theirs back."""

from __future__ import annotations

from sandfleet.core.profile import Span
from sandfleet.gateway.metrics import GatewayMetrics
from sandfleet.gateway.runs import RUN_IDLE_SECONDS, MemoryPolicyStore, Runs


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def series(metrics: GatewayMetrics) -> set[str]:
    return {
        sample.labels["run"]
        for family in metrics.registry.collect()
        if family.name == "sandfleet_loop_phase_seconds"
        for sample in family.samples
        if sample.name.endswith("_count")
    }


def test_runs_past_the_limit_share_one_series() -> None:
    clock = Clock()
    metrics = GatewayMetrics(metric_runs=3)
    runs = Runs(MemoryPolicyStore(), metrics, clock=clock)
    for i in range(100):
        runs.record(f"run-{i}", [Span("generate", clock.now - 1, clock.now, "actor")])
    assert series(metrics) == {"run-0", "run-1", "run-2", "other"}


def test_a_run_silent_for_an_hour_gives_its_series_back() -> None:
    clock = Clock()
    metrics = GatewayMetrics(metric_runs=1)
    runs = Runs(MemoryPolicyStore(), metrics, clock=clock)
    runs.record("old", [Span("generate", clock.now - 1, clock.now, "actor")])
    clock.now += RUN_IDLE_SECONDS + 1
    runs.record("new", [Span("generate", clock.now - 1, clock.now, "actor")])
    assert series(metrics) == {"new"}
    assert runs.profile("old", 10 * RUN_IDLE_SECONDS).spans == 0
