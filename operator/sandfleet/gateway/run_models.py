"""Request and response bodies of the run routes: policy versions, spans and the loop profile.

What a client sends and reads is sandfleet.wire's (PublishPolicyBody, PolicyAnswer, SpansBody, ...):
tests/unit/gateway/test_models.py holds these models' fields to it.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, Field

from sandfleet.core.policy_versions import RunPolicy
from sandfleet.core.profile import BOTTLENECKS, PHASES, Profile, Source, Span
from sandfleet.gateway.models import Strict
from sandfleet.wire import PolicyMode, SpanSource


class PublishPolicy(Strict):
    """The learner publishes a policy version (and, optionally, the run's staleness rules)."""

    version: int = Field(ge=0, description="The learner's weights step; never goes backwards.")
    staleness_bound: int | None = Field(
        None, ge=0, le=1_000_000, description="Versions an acquire may lag; the last one (or 4) if omitted."
    )
    mode: PolicyMode | None = Field(
        None, description="Beyond the bound: refuse the acquire (409) or lease it labelled policy-stale."
    )


class PolicyView(BaseModel):
    run: str
    version: int
    staleness_bound: int
    mode: PolicyMode
    updated_at: float

    @classmethod
    def of(cls, policy: RunPolicy) -> PolicyView:
        return cls(
            run=policy.run,
            version=policy.version,
            staleness_bound=policy.staleness_bound,
            mode=policy.mode,
            updated_at=policy.updated_at,
        )


class SpanIn(Strict):
    phase: str = Field(min_length=1, max_length=32, description=f"One of: {', '.join(PHASES)}.")
    start: float = Field(ge=0, le=1e11, description="Unix seconds.")
    end: float = Field(ge=0, le=1e11, description="Unix seconds, not before start.")
    source: SpanSource = "actor"
    worker: str = Field("", max_length=128)


class SpansRequest(Strict):
    """Phase spans from actors and the learner (the gateway records its own)."""

    spans: list[SpanIn] = Field(default_factory=list, max_length=10_000)
    dropped_stale: int = Field(0, ge=0, description="Trajectories the learner dropped as too stale.")


class SpansResponse(BaseModel):
    run: str
    recorded: int


class SpanView(BaseModel):
    phase: str
    start: float
    end: float
    source: Source
    worker: str = ""


class SpansView(BaseModel):
    """The spans of a run one gateway replica holds (a profile merges every replica's)."""

    run: str
    window_seconds: float
    spans: list[SpanView]

    @classmethod
    def of(cls, run: str, window_seconds: float, spans: Iterable[Span]) -> SpansView:
        views = [SpanView(phase=s.phase, start=s.start, end=s.end, source=s.source, worker=s.worker)
                 for s in spans]  # fmt: skip
        return cls(run=run, window_seconds=window_seconds, spans=views)


class PhaseView(BaseModel):
    phase: str
    category: str
    count: int
    total_seconds: float
    p50_seconds: float
    p90_seconds: float
    p99_seconds: float


class VerdictView(BaseModel):
    bottleneck: str = Field(description=f"One of: {', '.join(BOTTLENECKS)}.")
    lever: str
    reason: str


class ProfileView(BaseModel):
    run: str
    window_seconds: float
    spans: int
    phases: list[PhaseView]
    split: dict[str, float] = Field(description="Category -> share of the loop's time.")
    seconds: dict[str, float]
    learner_busy: float | None
    verdict: VerdictView
    notes: list[str]
    policy: PolicyView | None

    @classmethod
    def of(cls, run: str, profile: Profile, policy: RunPolicy | None) -> ProfileView:
        return cls(
            run=run,
            window_seconds=profile.window_end - profile.window_start,
            spans=profile.spans,
            phases=[
                PhaseView(
                    phase=p.phase,
                    category=p.category,
                    count=p.count,
                    total_seconds=p.total_seconds,
                    p50_seconds=p.p50,
                    p90_seconds=p.p90,
                    p99_seconds=p.p99,
                )
                for p in profile.phases
            ],
            split=profile.split,
            seconds=profile.seconds,
            learner_busy=profile.learner_busy,
            verdict=VerdictView(
                bottleneck=profile.verdict.bottleneck,
                lever=profile.verdict.lever,
                reason=profile.verdict.reason,
            ),
            notes=profile.notes,
            policy=PolicyView.of(policy) if policy else None,
        )
