"""The loop profiler's arithmetic: phase spans -> split, percentiles and a verdict (pure, time passed in).

Actors and the learner report spans for what only they see (generate, score, train, weight sync);
the gateway records what it sees itself (queue, claim, boot, exec, and the idle time between execs
on a lease, which is the model's generation time seen from outside). Phases fall into four
categories. Where both sides measure the same thing (an actor's `sandbox_wait` and the gateway's
`queue`+`claim`), a category takes the larger of the two sources, never their sum.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, get_args

from sandfleet.wire import SpanSource

Source = Literal[SpanSource, "gateway"]  # who reported a span: a caller (sandfleet.wire's), or the gateway
SOURCES: Final[tuple[Source, ...]] = ("actor", "learner", "gateway")

# phase -> category. Actor/learner phases first, then the gateway's own.
CATEGORY: Final[dict[str, str]] = {
    "generate": "generation",
    "idle": "generation",  # gateway: time between execs on a lease, i.e. the model thinking
    "sandbox_wait": "sandbox",
    "queue": "sandbox",
    "claim": "sandbox",
    "boot": "sandbox",
    "tool": "sandbox",
    "exec": "sandbox",
    "score": "scoring",
    "train": "training",
    "weight_sync": "training",
}
PHASES: Final[tuple[str, ...]] = tuple(CATEGORY)
CATEGORIES: Final[tuple[str, ...]] = ("generation", "sandbox", "scoring", "training")

LEARNER_BUSY: Final = 0.8  # a learner busy this fraction of the window is the bottleneck
Bottleneck = Literal["none", "rollout-sandbox", "rollout-scoring", "rollout-generation", "train"]
BOTTLENECKS: Final[tuple[Bottleneck, ...]] = get_args(Bottleneck)


class ProfileError(ValueError):
    """A span that cannot be recorded, with why."""


@dataclass(frozen=True)
class Span:
    """One timed phase of the loop, in unix seconds."""

    phase: str
    start: float
    end: float
    source: Source = "actor"
    worker: str = ""

    @property
    def seconds(self) -> float:
        return self.end - self.start


def check_span(span: Span) -> Span:
    """The span if it is recordable, else ProfileError saying why."""
    if span.phase not in CATEGORY:
        raise ProfileError(f"unknown phase {span.phase!r}; phases are: {', '.join(PHASES)}")
    if span.source not in SOURCES:
        raise ProfileError(f"unknown source {span.source!r}; sources are: {', '.join(SOURCES)}")
    if not (math.isfinite(span.start) and math.isfinite(span.end)) or span.end < span.start:
        raise ProfileError(f"span {span.phase!r} ends before it starts ({span.start} -> {span.end})")
    return span


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` percentile (0 < q <= 100) of `values`; 0.0 for no values."""
    if not 0 < q <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {q}")
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(math.ceil(q / 100 * len(ordered)), 1)
    return ordered[rank - 1]


def clip(span: Span, start: float, end: float) -> float:
    """Seconds of `span` inside the window [start, end]."""
    return max(min(span.end, end) - max(span.start, start), 0.0)


@dataclass(frozen=True)
class PhaseStats:
    """One phase over the window: how often, how long in total, and its percentiles."""

    phase: str
    category: str
    count: int
    total_seconds: float
    p50: float
    p90: float
    p99: float


@dataclass(frozen=True)
class BottleneckVerdict:
    """The bottleneck and the lever that fits it."""

    bottleneck: Bottleneck
    lever: str
    reason: str


@dataclass(frozen=True)
class Profile:
    """The loop over one window: per-phase stats, the split by category, and the verdict."""

    window_start: float
    window_end: float
    phases: list[PhaseStats]
    split: dict[str, float]  # category -> fraction of rollout+training time (sums to 1 or all 0)
    seconds: dict[str, float]  # category -> seconds in the window
    learner_busy: float | None  # fraction of the window the learner trained; None without learner spans
    verdict: BottleneckVerdict
    spans: int = 0
    notes: list[str] = field(default_factory=list)


def category_seconds(spans: Iterable[Span], start: float, end: float) -> dict[str, float]:
    """Seconds per category inside the window; for each category, the larger source's total."""
    by_source: dict[tuple[str, str], float] = {}
    for span in spans:
        key = (CATEGORY[span.phase], span.source)
        by_source[key] = by_source.get(key, 0.0) + clip(span, start, end)
    return {
        category: max((v for (c, _), v in by_source.items() if c == category), default=0.0)
        for category in CATEGORIES
    }


def judge(seconds: dict[str, float], learner_busy: float | None) -> BottleneckVerdict:
    """Name the bottleneck from the category split and how busy the learner was."""
    rollout = seconds["generation"] + seconds["sandbox"] + seconds["scoring"]
    if rollout + seconds["training"] <= 0:
        return BottleneckVerdict(
            "none", "report spans (sandfleet.rl does) to get a verdict", "no spans in the window"
        )
    if learner_busy is not None and learner_busy >= LEARNER_BUSY:
        return BottleneckVerdict(
            "train",
            "speed up the learner: larger learner batch, more learner GPUs, or fewer weight syncs",
            f"the learner was busy {learner_busy:.0%} of the window, so actors wait on it",
        )
    if rollout <= 0:
        return BottleneckVerdict(
            "train", "add actors: the learner has nothing else to wait for", "only training in the window"
        )
    busy = "" if learner_busy is None else f"the learner was busy only {learner_busy:.0%}; "
    # Scoring runs the tests inside the sandbox, so together they weigh against generation; which of
    # the two is larger picks the lever: a warm sandbox does not make its tests run faster.
    in_sandbox = seconds["sandbox"] + seconds["scoring"]
    if in_sandbox >= seconds["generation"] and seconds["scoring"] > seconds["sandbox"]:
        return BottleneckVerdict(
            "rollout-scoring",
            "make each score cheaper, not the pool larger: run only the task's deciding tests, run"
            " them in parallel within the sandbox's CPU limit, pay the test runner's start-up once"
            " (a checkpoint with pytest imported), and check runsc's file-access and overlay options"
            " (docs/benchmarks.md); score in the background while generating",
            f"{busy}rollouts spend {seconds['scoring'] / rollout:.0%} of their time in tests and "
            f"{seconds['sandbox'] / rollout:.0%} waiting for and in sandboxes",
        )
    if in_sandbox >= seconds["generation"]:
        return BottleneckVerdict(
            "rollout-sandbox",
            "raise the pool's warm target or prefetch task images (POST /v1/prefetch); run tests in"
            " the background while generating, or run fewer of them per episode",
            f"{busy}rollouts spend {in_sandbox / rollout:.0%} of their time in sandboxes "
            f"({seconds['sandbox'] / rollout:.0%} waiting and in tools, {seconds['scoring'] / rollout:.0%} "
            "in tests)",
        )
    share = seconds["generation"] / rollout
    return BottleneckVerdict(
        "rollout-generation",
        "add actors or make them async (more episodes in flight per GPU), or batch generation",
        f"{busy}rollouts spend {share:.0%} of their time generating",
    )


def profile(spans: Iterable[Span], start: float, end: float) -> Profile:
    """The profile of the spans overlapping [start, end]."""
    if end < start:
        raise ProfileError(f"window ends before it starts ({start} -> {end})")
    inside = [s for s in spans if s.end >= start and s.start <= end]
    durations: dict[str, list[float]] = {}
    for span in inside:
        durations.setdefault(span.phase, []).append(clip(span, start, end))
    phases = [
        PhaseStats(
            phase=phase,
            category=CATEGORY[phase],
            count=len(values),
            total_seconds=sum(values),
            p50=percentile(values, 50),
            p90=percentile(values, 90),
            p99=percentile(values, 99),
        )
        for phase in PHASES
        if (values := durations.get(phase))
    ]
    seconds = category_seconds(inside, start, end)
    total = sum(seconds.values())
    split = {c: (seconds[c] / total if total > 0 else 0.0) for c in CATEGORIES}
    learner_spans = [s for s in inside if s.source == "learner" and CATEGORY[s.phase] == "training"]
    learner_busy = None
    if learner_spans and end > start:
        learner_busy = min(_union_seconds(learner_spans, start, end) / (end - start), 1.0)
    notes = []
    if not any(s.source == "actor" for s in inside) and inside:
        notes.append("no actor spans: generation is inferred from gateway idle time between execs")
    return Profile(
        start, end, phases, split, seconds, learner_busy, judge(seconds, learner_busy), len(inside), notes
    )


def _union_seconds(spans: Iterable[Span], start: float, end: float) -> float:
    """Seconds of the window covered by at least one span (overlaps counted once)."""
    intervals = sorted(
        (max(s.start, start), min(s.end, end)) for s in spans if s.end > start and s.start < end
    )
    covered, cursor = 0.0, start
    for a, b in intervals:
        a = max(a, cursor)
        if b > a:
            covered += b - a
            cursor = b
    return covered
