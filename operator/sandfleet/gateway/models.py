"""The gateway's request and response bodies, as pydantic models (they are the OpenAPI schema).

Their JSON is sandfleet.wire's (AcquireBody, LeaseJson, ProblemAnswer, ...), which the client writes
and reads without importing these: tests/unit/gateway/test_models.py holds each model to its twin.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.config import JsonDict

from sandfleet.core.leases import LeaseRecord
from sandfleet.core.model import SandboxPod
from sandfleet.wire import COUNT_KEYS, Outcome, RewardSource

NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# The most sandboxes one acquire may name in the schema; the gateway's settings bound groups and
# batches below it (SANDFLEET_GATEWAY_MAX_GROUP_SIZE, SANDFLEET_GATEWAY_MAX_BATCH_SIZE).
MAX_ACQUIRE = 10_000
# Image references are printable ASCII without spaces (and the same in JSON Schema and Python
# regexes, which disagree on what `\S` excludes).
IMAGE = r"^[!-~]+$"


class Strict(BaseModel):
    # Strict types: `true` is not the integer 1, and "5" is not 5; a client is told, not guessed at.
    model_config = ConfigDict(extra="forbid", strict=True)


# "A pool, an image, or both", in the schema too, so a client (or a generated test) knows `{}` is
# refused: each branch requires its field with a non-null value.
POOL_OR_IMAGE: JsonDict = {
    "anyOf": [
        {"required": ["pool"], "properties": {"pool": {"type": "string"}}},
        {"required": ["image"], "properties": {"image": {"type": "string"}}},
    ]
}


class AcquireRequest(Strict):
    """Lease one sandbox, `count` all or nothing (a group), or a batch of up to `count` (`min_count`)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=POOL_OR_IMAGE)

    pool: str | None = Field(
        None, min_length=1, max_length=253, pattern=NAME, description="SandboxPool name."
    )
    image: str | None = Field(
        None,
        min_length=1,
        max_length=512,
        pattern=IMAGE,
        description="Task image (pre-warmed with /v1/prefetch); the pool's own image when omitted.",
    )
    count: int = Field(
        1,
        ge=1,
        le=MAX_ACQUIRE,
        description="Sandboxes to lease at once: all of them (a GRPO group), or up to this many (a batch).",
    )
    min_count: int | None = Field(
        None,
        ge=1,
        le=MAX_ACQUIRE,
        description="A batch: the fewest sandboxes accepted. Granted as soon as `count` are leased, or at "
        "the end of `wait_seconds` with at least this many (fewer: 504, nothing kept). Omitted or equal "
        "to `count`: all or nothing.",
    )
    regions: list[str] = Field(
        default_factory=list, max_length=16, description="Preferred regions, best first."
    )
    ttl_seconds: int | None = Field(
        None, ge=1, le=604800, description="Lease TTL; the pool's default when omitted."
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=32,
        description="Free-form labels (run, episode, ...); `run` allows bulk release.",
    )
    policy_version: int | None = Field(None, ge=0, description="Policy version of the episode.")
    idempotency_key: str | None = Field(
        None, min_length=1, max_length=128, description="Retries with the same key get the same lease."
    )
    wait_seconds: float = Field(
        30.0, ge=0, le=600, description="How long to wait in the pool's queue for a sandbox."
    )

    @model_validator(mode="after")
    def pool_or_image(self) -> Self:
        if self.pool is None and self.image is None:
            raise ValueError("give a pool, an image, or both (GET /v1/pools lists the pools)")
        if self.min_count is not None and self.min_count > self.count:
            raise ValueError(
                f"min_count ({self.min_count}) is above count ({self.count}): a batch asks for up to "
                "`count` sandboxes and accepts no fewer than `min_count`"
            )
        return self


class PrefetchImage(Strict):
    image: str = Field(min_length=1, max_length=512, pattern=IMAGE)
    count: int = Field(ge=0, le=10000, description="Warm sandboxes of this image to keep.")


class PrefetchRequest(Strict):
    """Images a trainer will need soon (its dataloader's lookahead), to be warmed ahead."""

    pool: str = Field(min_length=1, max_length=253, pattern=NAME)
    images: list[PrefetchImage] = Field(min_length=1, max_length=256)
    ttl_seconds: int = Field(600, ge=1, le=86400, description="How long to keep them warm.")


class PrefetchResponse(BaseModel):
    pool: str
    prewarms: list[str] = Field(description="SandboxPrewarm objects written (or local pools sized).")


class Timings(BaseModel):
    """Where the request's time went, in milliseconds."""

    queue_ms: float = 0.0
    claim_ms: float = 0.0
    boot_ms: float = 0.0
    total_ms: float = 0.0


class LeaseView(BaseModel):
    """One lease and how to reach its sandbox through the gateway."""

    id: str
    pool: str
    holder: str
    region: str
    sandbox: str
    acquired_at: float
    expires_at: float
    ttl_seconds: int
    labels: dict[str, str]
    policy_version: int | None
    idempotency_key: str | None
    image_digest: str = Field(
        "", description="Digest of the image the sandbox runs (empty until the runtime reports it)."
    )
    template_hash: str = Field("", description="Hash of the pool template the sandbox was made from.")
    cluster: str = Field(
        "", description='The fleet member cluster that holds it, as its id says ("": the only cluster).'
    )

    @classmethod
    def of(cls, lease: LeaseRecord, sandbox: SandboxPod) -> LeaseView:
        return cls(
            id=lease.id,
            pool=lease.pool,
            holder=lease.holder,
            region=sandbox.region,
            sandbox=sandbox.name,
            acquired_at=lease.acquired_at,
            expires_at=lease.expires_at,
            ttl_seconds=lease.ttl_seconds,
            labels=lease.labels,
            policy_version=lease.policy_version,
            idempotency_key=lease.idempotency_key,
            image_digest=sandbox.image_digest,
            template_hash=sandbox.template_hash,
            cluster=sandbox.cluster,
        )


class AcquireResponse(BaseModel):
    leases: list[LeaseView]
    requested: int = Field(description="Sandboxes asked for (`count`).")
    granted: int = Field(description="Sandboxes leased: all for a group, `min_count` or more for a batch.")
    queue_position: int = Field(description="Callers ahead on arrival; 0 when served at once.")
    timings: Timings


class RenewRequest(Strict):
    ttl_seconds: int | None = Field(None, ge=1, le=604800)


class LeaseResponse(BaseModel):
    lease: LeaseView


class ReleaseResponse(BaseModel):
    id: str
    released: bool = Field(description="False when the lease had already ended (still a success).")


class BulkReleaseResponse(BaseModel):
    run: str
    released: list[str]


class LeaseList(BaseModel):
    leases: list[LeaseView]


class PlaceView(BaseModel):
    """A pool's sandboxes in one cluster and region."""

    cluster: str = Field(description='The fleet member cluster ("" when the gateway serves one cluster).')
    region: str = Field(description='The region label its nodes carry ("" when unplaced or local).')
    warm: int
    leased: int


class PoolView(BaseModel):
    name: str
    regions: list[str]
    image: str
    warm: int
    leased: int
    waiting: int
    default_ttl_seconds: int
    max_ttl_seconds: int
    places: list[PlaceView] = Field(
        default_factory=list, description="Its warm and leased sandboxes per cluster and region."
    )


class PoolList(BaseModel):
    pools: list[PoolView]


class Problem(BaseModel):
    """Every error: what was wrong and what to do."""

    error: str = Field(description="A stable machine-readable code.")
    detail: str = Field(description="What went wrong and what to do about it.")
    queue_position: int | None = None
    eta_seconds: float | None = None
    retry_after_seconds: int | None = None
    source: str | None = Field(
        None, description="`sandbox` when the sandbox's agent refused (its code and message, reshaped)."
    )


class EvaluateResponse(BaseModel):
    """The outcome of POST /v1/leases/{id}/evaluate, as the sandbox's agent reports it."""

    # The schema of an answer the gateway passes through unread: its fields are sandfleet.wire's
    # EvaluationReport (tests/unit/gateway/test_evaluate_schema.py holds them equal). Published as
    # `Evaluation` (the schema's component and title), the name generated clients know it by; in
    # Python that name is the client's typed result.
    __qualname__ = "Evaluation"
    model_config = ConfigDict(title="Evaluation")

    outcome: Literal[Outcome.PASSED, Outcome.FAILED, Outcome.TIMED_OUT, Outcome.INFRA_ERROR] = Field(
        description="passed: reward >= 1; failed: the tests ran and did not earn it; timed_out: killed at "
        "the timeout; infra_error: the verifier could not run or a required report is missing (mask it)."
    )
    outcome_reason: str | None = Field(None, description="Why, unless it plainly passed or failed.")
    reward: float = Field(
        description="With a task: 1.0 if every deciding test passed, else 0.0. With a command: the reward "
        "file's value, else 1.0 for exit status 0, else 0.0."
    )
    reward_source: Literal[RewardSource.DECIDING_TESTS, RewardSource.REWARD_FILE, RewardSource.EXIT_CODE]
    deciding: dict[str, Any] | None = Field(
        None, description="With a task: its deciding tests' total, how many passed, and those that did not."
    )
    tampered: list[str] | None = Field(
        None,
        description="With a task: what the episode did to the task's test infrastructure (left out of "
        "scoring) and any tampering with the test run found.",
    )
    carried: dict[str, Any] | None = Field(
        None, description="With a task: the source files taken from the episode's tree (changed, deleted)."
    )
    counts: dict[str, int] = Field(
        description=f"Per-test counts from the JUnit report: {', '.join(COUNT_KEYS)}."
    )
    tests: list[dict[str, Any]] = Field(
        description="One entry per JUnit testcase: name, outcome, duration_s."
    )
    tests_report: str | None = None
    patch: dict[str, Any]
    exec: dict[str, Any]
    durations: dict[str, float]
