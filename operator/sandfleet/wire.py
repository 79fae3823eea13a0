"""The words on the wire that the client, the gateway and the CLI share: the bodies, their fields, codes.

Standard library only: the client speaks HTTP and must not import the gateway's pydantic models,
so what both must spell the same lives here, once. Each body the client sends or reads is a
TypedDict: `...Body` what a caller sends, `...Answer` what it gets back, `...Json` an object inside
one, `...Query` a query string (the files and jobs routes' bodies, which the client passes through
untouched, aside). Then the outcome vocabulary, and the header and codes both sides read.

The gateway's pydantic models (gateway/models.py, gateway/run_models.py: FastAPI validates and
publishes them) are held to these, field by field, by tests/unit/gateway/test_models.py. The
in-sandbox agent cannot import sandfleet at all: it keeps its own copy of the words
(sandbox_image/sandfleet_agent/wire.py), and tests/unit/agent/test_wire.py holds that copy to this
one, and the fields the agent reads and answers with to ExecBody, EvaluateRequest, ExecAnswer and
EvaluationReport.
"""

# No `from __future__ import annotations`: TypedDict reads NotRequired from evaluated annotations
# only (Python 3.11), and the tests check each TypedDict's required keys at run time.
from enum import StrEnum
from typing import Any, Final, Literal, NotRequired, TypedDict


class Outcome(StrEnum):
    """How an evaluation ended; a trainer masks INFRA_ERROR episodes rather than learn from their zero."""

    PASSED = "passed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    INFRA_ERROR = "infra_error"


class RewardSource(StrEnum):
    """What an evaluation's reward was read from."""

    DECIDING_TESTS = "deciding_tests"  # a task's named tests, run in a scoring tree
    REWARD_FILE = "reward_file"  # the verifier's reward.txt or reward.json
    EXIT_CODE = "exit_code"  # the test command's exit status: 0 earns 1.0


# The keys of an evaluation's `counts`, in the order pytest's summary line names them.
COUNT_KEYS: Final = ("passed", "failed", "error", "skipped", "xfailed")

# Agent error codes an evaluate call can be refused with that still amount to an outcome
# (`client.Evaluation.of_error`): a patch that does not apply is the episode's doing (FAILED) ...
BAD_PATCH: Final = "bad_patch"
# ... while a verifier that cannot be run is the task's or the sandbox's (INFRA_ERROR).
VERIFIER_CANNOT_RUN: Final = frozenset(
    {"no_test_command", "command_not_found", "command_not_executable", "verifier_dir_unwritable"}
)

# An agent whose commands run as root refuses to score in place (its processes may reach the agent):
# the gateway scores such an episode in a clean sandbox (gateway/clean_scoring.py).
SCORE_ELSEWHERE: Final = "score_elsewhere"

# A Problem's `source` when the sandbox's agent refused, not the gateway (a 404 for a missing file,
# not for a missing lease): the gateway's proxy writes it, the client reads it.
FROM_SANDBOX: Final = "sandbox"

# Sent by the client on the first try of an acquire whose idempotency key it made itself: a key
# never sent before has no earlier attempt for the gateway to read back.
FRESH_KEY_HEADER: Final = "sandfleet-fresh-key"


# -- Leases: POST /v1/leases, GET /v1/leases[/{id}], POST .../renew, DELETE, POST /v1/runs/{run}/release


class AcquireBody(TypedDict, total=False):
    """The body of POST /v1/leases: a pool, an image, or both; `count` at once, or a batch of `min_count`+."""

    pool: str
    image: str  # a task image the pool serves
    count: int
    min_count: int  # a batch: the fewest accepted when `wait_seconds` ends
    regions: list[str]  # preferred, best first
    ttl_seconds: int
    labels: dict[str, str]  # `run` ties the lease to its run (bulk release, policy, profile)
    policy_version: int
    idempotency_key: str  # retries with the same key get the same leases
    wait_seconds: float


class LeaseJson(TypedDict):
    """One lease and where its sandbox is, as every lease answer carries it."""

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
    image_digest: str  # exactly what the episode runs on ("" until the runtime reports it) ...
    template_hash: str  # ... and the hash of the pool template its sandbox was made from
    cluster: str  # the fleet member that holds it ("" for the only cluster)


class TimingsJson(TypedDict):
    """Where an acquire's time went, in milliseconds."""

    queue_ms: float
    claim_ms: float
    boot_ms: float
    total_ms: float


class AcquireAnswer(TypedDict):
    """The answer to POST /v1/leases (201)."""

    leases: list[LeaseJson]
    requested: int
    granted: int
    queue_position: int  # callers ahead on arrival
    timings: TimingsJson


class RenewBody(TypedDict, total=False):
    """The body of POST /v1/leases/{id}/renew: the pool's default TTL when `ttl_seconds` is left out."""

    ttl_seconds: int


class LeaseAnswer(TypedDict):
    """The answer to GET /v1/leases/{id} and POST /v1/leases/{id}/renew."""

    lease: LeaseJson


class LeasesQuery(TypedDict, total=False):
    """The query of GET /v1/leases: only this pool's, only this run's."""

    pool: str
    run: str


class LeasesAnswer(TypedDict):
    """The answer to GET /v1/leases: the caller's live leases."""

    leases: list[LeaseJson]


class ReleaseAnswer(TypedDict):
    """The answer to DELETE /v1/leases/{id}; `released` is false when the lease had already ended."""

    id: str
    released: bool


class RunReleaseAnswer(TypedDict):
    """The answer to POST /v1/runs/{run}/release: the leases it released."""

    run: str
    released: list[str]


# -- Pools: GET /v1/pools


class PlaceJson(TypedDict):
    """A pool's sandboxes in one cluster and region ("" for the only cluster, or no region)."""

    cluster: str
    region: str
    warm: int
    leased: int


class PoolJson(TypedDict):
    """One pool: its counts, its image and TTLs, and where its sandboxes are."""

    name: str
    regions: list[str]
    image: str
    warm: int
    leased: int
    waiting: int
    default_ttl_seconds: int
    max_ttl_seconds: int
    places: list[PlaceJson]


class PoolsAnswer(TypedDict):
    """The answer to GET /v1/pools."""

    pools: list[PoolJson]


# -- Runs: policy versions, phase spans and the loop profile, under /v1/runs/{run}

# What a run does with an acquire beyond its staleness bound: refuse it (409), or lease it flagged.
PolicyMode = Literal["refuse", "flag"]
POLICY_MODES: Final[tuple[PolicyMode, ...]] = ("refuse", "flag")


class PublishPolicyBody(TypedDict):
    """The body of POST /v1/runs/{run}/policy: the learner's version, and optionally the run's rules."""

    version: int
    staleness_bound: NotRequired[int]
    mode: NotRequired[PolicyMode]


class PolicyAnswer(TypedDict):
    """The answer to GET and POST /v1/runs/{run}/policy."""

    run: str
    version: int
    staleness_bound: int
    mode: PolicyMode
    updated_at: float


# Who may report a span; the gateway records its own spans (source `gateway`) itself.
SpanSource = Literal["actor", "learner"]
SPAN_SOURCES: Final[tuple[SpanSource, ...]] = ("actor", "learner")


class SpanBody(TypedDict):
    """One timed phase of the loop, in unix seconds."""

    phase: str
    start: float
    end: float
    source: NotRequired[SpanSource]
    worker: NotRequired[str]


class SpansBody(TypedDict, total=False):
    """The body of POST /v1/runs/{run}/spans."""

    spans: list[SpanBody]
    dropped_stale: int  # trajectories the learner dropped as too stale


class SpansAnswer(TypedDict):
    """The answer to POST /v1/runs/{run}/spans: how many spans were recorded."""

    run: str
    recorded: int


class ProfileQuery(TypedDict, total=False):
    """The query of GET /v1/runs/{run}/profile."""

    window_seconds: float


class PhaseJson(TypedDict):
    """One phase of the loop profile: how often, how long in all, and its percentiles."""

    phase: str
    category: str
    count: int
    total_seconds: float
    p50_seconds: float
    p90_seconds: float
    p99_seconds: float


class VerdictJson(TypedDict):
    """The loop profile's bottleneck and the lever to pull."""

    bottleneck: str
    lever: str
    reason: str


class ProfileAnswer(TypedDict):
    """The answer to GET /v1/runs/{run}/profile."""

    run: str
    window_seconds: float
    spans: int
    phases: list[PhaseJson]
    split: dict[str, float]  # category -> share of the loop's time
    seconds: dict[str, float]
    learner_busy: float | None
    verdict: VerdictJson
    notes: list[str]
    policy: PolicyAnswer | None


# -- Errors


class ProblemAnswer(TypedDict):
    """Every error the gateway answers with: a stable code, and what to do."""

    error: str
    detail: str
    queue_position: NotRequired[int]  # 429 and 504
    eta_seconds: NotRequired[float]
    retry_after_seconds: NotRequired[int]
    source: NotRequired[str]  # FROM_SANDBOX when the sandbox's agent refused


# -- The sandbox's agent, reached through POST /v1/leases/{id}/exec and .../evaluate (forwarded unread)


class ExecBody(TypedDict, total=False):
    """The body of POST /v1/leases/{id}/exec: exactly one of `argv` and `shell`."""

    argv: list[str]
    shell: str
    cwd: str
    env: dict[str, str]
    stdin: str
    stdin_base64: str
    timeout_s: float
    max_output_bytes: int  # per stream
    encoding: str  # utf-8 (the default) or base64 (the exact bytes)


class ExecAnswer(TypedDict):
    """The answer to POST /v1/leases/{id}/exec, as the sandbox's agent writes it."""

    exit_code: int | None
    signal: int | None
    timed_out: bool
    killed: bool
    stdout: str
    stderr: str
    stdout_bytes: int  # produced, of which `stdout` holds up to `max_output_bytes`
    stderr_bytes: int
    stdout_truncated: bool
    stderr_truncated: bool
    duration_s: float
    encoding: str
    stdout_binary: NotRequired[bool]  # with utf-8: the bytes were not UTF-8 (replaced)
    stderr_binary: NotRequired[bool]


class EvaluateRequest(ExecBody, total=False):
    """The body of POST /v1/leases/{id}/evaluate: a `task`, or a test command (`argv` or `shell`)."""

    patch: str  # a unified diff applied first
    task: dict[str, object]  # a catalogue task's scoring object (`Task.scoring()`): its tests decide
    junit_xml: str  # the report's name in the verifier's directory
    require_report: bool  # no readable JUnit report is INFRA_ERROR, not a zero


class EvaluationReport(TypedDict):
    """The answer to POST /v1/leases/{id}/evaluate, as the sandbox's agent writes it."""

    outcome: str  # an Outcome's value
    reward: float
    reward_source: str  # a RewardSource's value
    counts: dict[str, int]  # by COUNT_KEYS
    tests: list[dict[str, Any]]  # one per test: name, outcome, duration_s
    patch: dict[str, Any]
    exec: dict[str, Any]
    durations: dict[str, float]
    tests_report: NotRequired[str | None]
    outcome_reason: NotRequired[str | None]  # why, unless it plainly passed or failed
    deciding: NotRequired[dict[str, Any]]  # with a task: its deciding tests' tally
    tampered: NotRequired[list[str]]  # with a task
    carried: NotRequired[dict[str, Any]]  # with a task
    reward_error: NotRequired[str]  # with a command: what was wrong with the reward file
    tests_error: NotRequired[str]  # with a command: why the JUnit report gave no results
