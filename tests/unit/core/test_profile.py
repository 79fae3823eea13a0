"""The loop profiler: window clipping, percentiles, the category split and verdicts on crafted spans."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.profile import (
    BOTTLENECKS,
    CATEGORIES,
    PHASES,
    ProfileError,
    Span,
    check_span,
    clip,
    percentile,
    profile,
)


def spans(phase: str, count: int, seconds: float, source: str = "actor", gap: float = 0.0) -> list[Span]:
    out, t = [], 0.0
    for _ in range(count):
        out.append(Span(phase, t, t + seconds, source))  # type: ignore[arg-type]
        t += seconds + gap
    return out


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 90) == 90.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([3.0], 1) == 3.0
    assert percentile([], 50) == 0.0
    with pytest.raises(ValueError, match="percentile"):
        percentile(values, 0)


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=50), st.floats(0.1, 100))
def test_percentile_is_an_element_within_bounds_and_monotonic(values: list[float], q: float) -> None:
    p = percentile(values, q)
    assert p in values
    assert min(values) <= p <= max(values)
    assert percentile(values, min(q + 10, 100)) >= p


def test_clip_to_window() -> None:
    span = Span("exec", 5.0, 15.0)
    assert clip(span, 0, 20) == 10.0
    assert clip(span, 10, 20) == 5.0
    assert clip(span, 20, 30) == 0.0


@pytest.mark.parametrize(
    "bad",
    [Span("nap", 0, 1), Span("exec", 2, 1), Span("exec", 0, float("nan")), Span("exec", 0, 1, "robot")],  # type: ignore[arg-type]
)
def test_bad_spans_are_refused(bad: Span) -> None:
    with pytest.raises(ProfileError):
        check_span(bad)


def test_phase_stats_and_split() -> None:
    crafted = spans("generate", 10, 2.0) + spans("exec", 10, 1.0) + spans("score", 5, 0.2)
    result = profile(crafted, 0.0, 100.0)
    stats = {p.phase: p for p in result.phases}
    assert stats["generate"].count == 10
    assert stats["generate"].total_seconds == pytest.approx(20.0)
    assert stats["exec"].p50 == pytest.approx(1.0)
    assert result.seconds["generation"] == pytest.approx(20.0)
    assert result.seconds["sandbox"] == pytest.approx(10.0)
    assert result.seconds["scoring"] == pytest.approx(1.0)
    assert result.split["generation"] == pytest.approx(20 / 31)
    assert result.learner_busy is None
    assert result.spans == 25


def test_same_thing_from_two_sources_is_not_double_counted() -> None:
    actor = spans("sandbox_wait", 4, 1.0)
    gateway = spans("queue", 4, 0.5, "gateway") + spans("claim", 4, 0.25, "gateway")
    result = profile(actor + gateway, 0.0, 100.0)
    assert result.seconds["sandbox"] == pytest.approx(4.0)  # max(actor 4.0, gateway 3.0)


def test_verdict_sandbox_bound_says_warm_pool_or_prefetch() -> None:
    crafted = spans("generate", 10, 1.0) + spans("sandbox_wait", 10, 3.0) + spans("train", 2, 1.0, "learner")
    verdict = profile(crafted, 0.0, 100.0).verdict
    assert verdict.bottleneck == "rollout-sandbox"
    assert "warm" in verdict.lever
    assert "prefetch" in verdict.lever


def test_verdict_generation_bound_says_more_actors() -> None:
    crafted = spans("generate", 10, 5.0) + spans("exec", 10, 0.5) + spans("train", 2, 1.0, "learner")
    verdict = profile(crafted, 0.0, 100.0).verdict
    assert verdict.bottleneck == "rollout-generation"
    assert "actors" in verdict.lever


def test_gateway_idle_alone_counts_as_generation() -> None:
    crafted = spans("idle", 10, 4.0, "gateway") + spans("exec", 10, 1.0, "gateway")
    result = profile(crafted, 0.0, 100.0)
    assert result.verdict.bottleneck == "rollout-generation"
    assert result.notes


def test_verdict_train_bound_when_the_learner_is_always_busy() -> None:
    learner = spans("train", 9, 9.0, "learner", gap=0.5) + spans("weight_sync", 1, 0.5, "learner")
    crafted = learner + spans("generate", 10, 1.0) + spans("exec", 10, 5.0)
    result = profile(crafted, 0.0, 90.0)
    assert result.learner_busy is not None
    assert result.learner_busy >= 0.8
    assert result.verdict.bottleneck == "train"
    assert "learner" in result.verdict.lever


def test_overlapping_learner_spans_count_once() -> None:
    learner = [Span("train", 0, 10, "learner"), Span("train", 5, 10, "learner")]
    assert profile(learner, 0.0, 20.0).learner_busy == pytest.approx(0.5)


def test_no_spans_no_verdict() -> None:
    result = profile([], 0.0, 10.0)
    assert result.verdict.bottleneck == "none"
    assert all(v == 0 for v in result.split.values())
    with pytest.raises(ProfileError):
        profile([], 10.0, 0.0)


span_strategy = st.builds(
    lambda phase, start, length, source: Span(phase, start, start + length, source),
    st.sampled_from(PHASES),
    st.floats(0, 1000),
    st.floats(0, 100),
    st.sampled_from(["actor", "learner", "gateway"]),
)


@given(st.lists(span_strategy, max_size=60), st.floats(0, 500), st.floats(0, 1000))
def test_profile_invariants(crafted: list[Span], start: float, length: float) -> None:
    result = profile(crafted, start, start + length)
    assert set(result.split) == set(CATEGORIES)
    total = sum(result.split.values())
    assert total == pytest.approx(1.0) or total == 0.0
    for stats in result.phases:
        assert 0 <= stats.p50 <= stats.p90 <= stats.p99 <= length + 1e-9
        assert stats.total_seconds <= stats.count * length + 1e-6
    if result.learner_busy is not None:
        assert 0.0 <= result.learner_busy <= 1.0
    assert result.verdict.bottleneck in BOTTLENECKS


def test_a_loop_whose_scoring_is_slow_is_scoring_bound_and_its_lever_is_not_the_warm_pool() -> None:
    # The demo's own profile: generation 11%, sandbox 13%, scoring 76%.
    crafted = spans("generate", 10, 1.1) + spans("exec", 10, 1.3) + spans("score", 10, 7.6)
    verdict = profile(crafted, 0.0, 100.0).verdict
    assert verdict.bottleneck == "rollout-scoring"
    assert "76% of their time in tests" in verdict.reason
    assert "deciding tests" in verdict.lever
    assert "warm target" not in verdict.lever


def test_tests_and_sandbox_time_weigh_together_against_generation() -> None:
    # Neither alone outweighs generation; together they do, and the larger names the lever.
    crafted = spans("generate", 10, 1.0) + spans("sandbox_wait", 10, 0.6) + spans("score", 10, 0.5)
    assert profile(crafted, 0.0, 100.0).verdict.bottleneck == "rollout-sandbox"
    crafted = spans("generate", 10, 1.0) + spans("sandbox_wait", 10, 0.5) + spans("score", 10, 0.6)
    assert profile(crafted, 0.0, 100.0).verdict.bottleneck == "rollout-scoring"
