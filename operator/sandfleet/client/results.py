"""What the client's calls return: a lease, a command's result, an evaluation, read from wire's answers.

Each `of` reads a JSON answer by sandfleet.wire's field names (`LeaseJson`, `ExecAnswer`,
`EvaluationReport`), tolerating the fields an older gateway or agent did not send yet.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from sandfleet.client.errors import SandfleetError
from sandfleet.wire import (
    BAD_PATCH,
    VERIFIER_CANNOT_RUN,
    EvaluationReport,
    ExecAnswer,
    LeaseJson,
    Outcome,
    TimingsJson,
)


@dataclass(frozen=True)
class Lease:
    """A lease as the gateway returned it."""

    id: str
    pool: str
    sandbox: str
    region: str
    expires_at: float
    labels: dict[str, str]
    policy_version: int | None
    timings: dict[str, float] = field(default_factory=dict)  # an acquire's TimingsJson, by its keys
    image_digest: str = ""  # exactly what the episode runs on: the image's digest ...
    template_hash: str = ""  # ... and the hash of the pool template its sandbox was made from

    @classmethod
    def of(cls, data: Mapping[str, Any], timings: TimingsJson | None = None) -> Lease:
        lease = cast(LeaseJson, data)
        return cls(
            id=lease["id"],
            pool=lease["pool"],
            sandbox=lease["sandbox"],
            region=lease["region"],
            expires_at=lease["expires_at"],
            labels=lease.get("labels", {}),
            policy_version=lease.get("policy_version"),
            timings=cast(dict[str, float], dict(timings or {})),
            image_digest=str(lease.get("image_digest") or ""),
            template_hash=str(lease.get("template_hash") or ""),
        )


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one command in a sandbox."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    raw: dict[str, Any] = field(default_factory=dict)
    encoding: str = "utf-8"

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def truncated(self) -> bool:
        """Whether the output cap (`max_output_bytes`) cut either stream."""
        return self.stdout_truncated or self.stderr_truncated

    def data(self, stream: str = "stdout") -> bytes:
        """A stream's bytes as captured (exact with `encoding="base64"`, else UTF-8 with replacements)."""
        text = self.stdout if stream == "stdout" else self.stderr
        return base64.b64decode(text) if self.encoding == "base64" else text.encode()

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> ExecResult:
        answer = cast(ExecAnswer, data)
        return cls(
            exit_code=answer.get("exit_code"),
            stdout=answer.get("stdout", ""),
            stderr=answer.get("stderr", ""),
            timed_out=bool(answer.get("timed_out")),
            duration_s=float(answer.get("duration_s", 0.0)),
            stdout_truncated=bool(answer.get("stdout_truncated")),
            stderr_truncated=bool(answer.get("stderr_truncated")),
            raw=dict(data),
            encoding=str(answer.get("encoding", "utf-8")),
        )


@dataclass(frozen=True)
class Evaluation(Mapping[str, Any]):
    """An evaluation's result: typed fields, and the response itself (`result["exec"]` still works).

    `outcome` is the agent's (docs/tasks.md, "How rewards are computed"); `Sandbox.score` also
    turns a sandbox lost or an agent failure into INFRA_ERROR and a patch that does not apply into
    FAILED, instead of raising.
    """

    outcome: Outcome
    reward: float
    counts: dict[str, int] = field(default_factory=dict)
    tests: list[dict[str, Any]] = field(default_factory=list)
    reason: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        """Whether the episode's reward may be trained on (false for INFRA_ERROR)."""
        return self.outcome is not Outcome.INFRA_ERROR

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Evaluation:
        report = cast(EvaluationReport, data)
        try:
            outcome = Outcome(str(report.get("outcome")))
        except ValueError:
            # An agent from before typed outcomes: its reward is all there is to go on.
            outcome = Outcome.PASSED if float(report.get("reward", 0.0)) >= 1.0 else Outcome.FAILED
        return cls(
            outcome=outcome,
            reward=float(report.get("reward", 0.0)),
            counts={str(k): int(v) for k, v in dict(report.get("counts") or {}).items()},
            tests=list(report.get("tests") or []),
            reason=report.get("outcome_reason"),
            raw=dict(data),
        )

    @classmethod
    def of_error(cls, error: SandfleetError) -> Evaluation | None:
        """The evaluation an error amounts to, or None when it is the caller's to fix."""
        if error.code == BAD_PATCH:
            outcome = Outcome.FAILED  # the episode's patch: scored, not masked
        elif error.infrastructure or error.code in VERIFIER_CANNOT_RUN:
            outcome = Outcome.INFRA_ERROR
        else:
            return None
        raw = {"outcome": str(outcome), "reward": 0.0, "outcome_reason": error.detail, "error": error.code}
        return cls(outcome=outcome, reward=0.0, reason=error.detail, raw=raw)

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)
