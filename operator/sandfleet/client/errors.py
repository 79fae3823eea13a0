"""The client's typed errors: one class per way a call fails, read from the gateway's Problem answers."""

from __future__ import annotations

from typing import Any, cast

from sandfleet.wire import FROM_SANDBOX, ProblemAnswer


class SandfleetError(Exception):
    """An error the gateway answered with; `code` is stable, `detail` says what to do."""

    def __init__(self, status: int, code: str, detail: str, body: dict[str, Any] | None = None):
        super().__init__(f"{detail} (HTTP {status}, {code})")
        self.status = status
        self.code = code
        self.detail = detail
        self.body = body or {}

    @property
    def infrastructure(self) -> bool:
        """Whether the fleet failed (not the request, not the episode): a trainer masks such episodes."""
        return self.status >= 500 and self.status != 504


class SandboxError(SandfleetError):
    """The sandbox's agent refused or failed (`source: sandbox`): `code` is the agent's own."""


class Unauthorized(SandfleetError):
    """401: no or unknown token (set SANDFLEET_TOKEN or pass token=)."""


class Forbidden(SandfleetError):
    """403: the caller may not use this pool or lease."""


class NotFound(SandfleetError):
    """404: no such pool or lease."""


class LeaseEnded(SandfleetError):
    """410: the lease was released or expired; its sandbox is gone."""


class PolicyConflict(SandfleetError):
    """409: the episode's policy version is beyond its run's staleness bound (or a version went back)."""


class QueueFull(SandfleetError):
    """429: the pool's queue is full; `retry_after` says when to come back."""

    @property
    def retry_after(self) -> int:
        return int(cast(ProblemAnswer, self.body).get("retry_after_seconds", 1))


class NoSandboxInTime(SandfleetError):
    """504: no warm sandbox within the wait; the body has the queue position and ETA."""


class SandboxLost(SandfleetError):
    """502: the sandbox's agent stopped answering."""


class Unavailable(SandfleetError):
    """503: the gateway or its Kubernetes API is briefly unavailable; safe to retry."""


_BY_STATUS: dict[int, type[SandfleetError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: PolicyConflict,
    410: LeaseEnded,
    429: QueueFull,
    502: SandboxLost,
    503: Unavailable,
    504: NoSandboxInTime,
}
RETRYABLE = (Unavailable,)


def error_for(status: int, body: object) -> SandfleetError:
    """The typed exception for an error response's status and JSON body.

    The gateway answers every error as a Problem (`sandfleet.wire.ProblemAnswer`: `error`, `detail`,
    and `source: sandbox` for a refusal from inside the sandbox); an agent's own shape
    (`{"error": {"code", "message"}}`) is read too, so a code is never a stringified object.
    """
    problem: dict[str, Any] = body if isinstance(body, dict) else {}
    answer = cast(ProblemAnswer, problem)  # read by wire's names; only an agent's `error` differs
    error: object = problem.get("error")
    from_sandbox = answer.get("source") == FROM_SANDBOX or isinstance(error, dict)
    if isinstance(error, dict):
        code, detail = error.get("code"), error.get("message")
    else:
        code, detail = error, answer.get("detail")
    kind = SandboxError if from_sandbox and status != 502 else _BY_STATUS.get(status, SandfleetError)
    text = detail if isinstance(detail, str) and detail else f"HTTP {status} with no detail"
    return kind(status, code if isinstance(code, str) and code else "error", text, problem)
