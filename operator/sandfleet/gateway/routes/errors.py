"""Every error the gateway answers is a Problem that says what to do, never a stack trace."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sandfleet.core.leases import LeaseError
from sandfleet.core.policy_versions import PolicyError
from sandfleet.core.profile import ProfileError
from sandfleet.core.quotas import CapacityError, QuotaExceeded
from sandfleet.gateway.allow import allowed_methods
from sandfleet.gateway.auth import NotAllowed, Unauthenticated
from sandfleet.gateway.backend import RuntimeAway
from sandfleet.gateway.clean_scoring import NotApart
from sandfleet.gateway.disconnect import ClientGone
from sandfleet.gateway.lease_errors import (
    KeyReused,
    LeaseGone,
    NotTheHolder,
    PoolQueueFull,
    UnknownName,
    WaitTimeout,
)
from sandfleet.gateway.models import Problem
from sandfleet.gateway.proxy import SandboxUnreachable
from sandfleet.gateway.runs import InvalidRunName, NotYourRun, StalePolicy

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "description": text}
    for code, text in {
        400: "The body is not valid JSON, or the sandbox's agent refused the request.",
        401: "No or unknown bearer token.",
        403: "The caller may not use this pool, lease or run.",
        404: "No such pool or lease.",
        409: "The episode's policy version is beyond its run's staleness bound, or a version went back.",
        410: "The lease has ended (released or expired).",
        413: "The body is larger than the route accepts (1 MiB for control routes by default).",
        422: "The request is malformed: the detail says which field and why.",
        429: "The pool's queue is full, or the caller holds its quota of leases: retry after Retry-After.",
        502: "The sandbox's agent did not answer: the sandbox is lost.",
        503: "The Kubernetes API is unreachable or the gateway is not synced yet.",
        504: "No warm sandbox within wait_seconds: the detail has the queue position and ETA.",
    }.items()
}

# Errors whose message is the whole detail: the status and the `error` code each one answers with.
PROBLEMS: dict[type[Exception], tuple[int, str]] = {
    Unauthenticated: (401, "unauthenticated"),
    NotAllowed: (403, "forbidden"),
    NotTheHolder: (403, "forbidden"),
    NotYourRun: (403, "run_forbidden"),
    InvalidRunName: (422, "invalid_run"),
    UnknownName: (404, "not_found"),
    LeaseGone: (410, "lease_ended"),
    LeaseError: (422, "invalid_lease"),
    KeyReused: (422, "idempotency_key_reused"),
    StalePolicy: (409, "policy_stale"),
    PolicyError: (409, "policy_conflict"),
    ProfileError: (422, "invalid_span"),
    NotApart: (422, "bad_task"),
    SandboxUnreachable: (502, "sandbox_lost"),
    ClientGone: (499, "client_closed_request"),  # nobody reads it: the connection is gone
    RuntimeAway: (503, "unavailable"),
}


def problem(status: int, error: str, detail: str, **extra: Any) -> JSONResponse:
    """A Problem response; a `retry_after_seconds` in `extra` is also sent as Retry-After."""
    headers = {}
    if extra.get("retry_after_seconds") is not None:
        headers["Retry-After"] = str(extra["retry_after_seconds"])
    body = Problem(error=error, detail=detail, **extra).model_dump(exclude_none=True)
    return JSONResponse(body, status_code=status, headers=headers)


def validation_detail(errors: list[dict[str, Any]]) -> str:
    """One line naming each invalid field and why (`body` for the body as a whole)."""
    parts = []
    for item in errors:
        where = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
        parts.append(f"{where or 'body'}: {item.get('msg', 'invalid')}")
    return "; ".join(parts)


def problem_for(error: Exception) -> tuple[int, str]:
    """The status and code of an error in PROBLEMS, by its nearest listed class (as Starlette picks)."""
    return next(PROBLEMS[kind] for kind in type(error).__mro__ if kind in PROBLEMS)


async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
    return problem(422, "invalid_request", validation_detail(list(error.errors())))


async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    if error.status_code != 405:
        return problem(error.status_code, "http_error", str(error.detail))
    allow = allowed_methods(request.app.router.routes, request.scope)
    detail = f"{request.method} is not allowed on this path; it accepts {allow}"
    response = problem(405, "method_not_allowed", detail)
    response.headers["Allow"] = allow
    return response


async def listed(_: Request, error: Exception) -> JSONResponse:
    status, code = problem_for(error)
    response = problem(status, code, str(error))
    if status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    if status == 503:
        response.headers["Retry-After"] = "2"
    return response


async def queue_full(_: Request, error: PoolQueueFull) -> JSONResponse:
    a = error.admission
    return problem(
        429,
        "queue_full",
        str(error),
        queue_position=a.position,
        eta_seconds=round(a.eta_seconds, 3),
        retry_after_seconds=a.retry_after_seconds,
    )


async def over_capacity(_: Request, error: CapacityError) -> JSONResponse:
    return problem(422, error.code, str(error))


async def over_quota(_: Request, error: QuotaExceeded) -> JSONResponse:
    return problem(429, "quota_exceeded", str(error), retry_after_seconds=error.retry_after_seconds)


async def wait_timeout(_: Request, error: WaitTimeout) -> JSONResponse:
    return problem(
        504,
        "no_sandbox_in_time",
        str(error),
        queue_position=error.position,
        eta_seconds=round(error.eta_seconds, 3),
        retry_after_seconds=max(1, round(error.eta_seconds)),
    )


async def unavailable(_: Request, error: Exception) -> JSONResponse:
    # Reached when the apiserver (or another dependency) fails mid-request: a 503 to retry.
    return problem(
        503,
        "unavailable",
        f"a dependency failed ({type(error).__name__}); retry shortly",
        retry_after_seconds=2,
    )


def add_error_handlers(app: FastAPI) -> None:
    """Answer every error `app` can raise with its Problem."""
    app.add_exception_handler(RequestValidationError, invalid)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]
    for kind in PROBLEMS:
        app.add_exception_handler(kind, listed)
    app.add_exception_handler(PoolQueueFull, queue_full)  # type: ignore[arg-type]
    app.add_exception_handler(CapacityError, over_capacity)  # type: ignore[arg-type]
    app.add_exception_handler(QuotaExceeded, over_quota)  # type: ignore[arg-type]
    app.add_exception_handler(WaitTimeout, wait_timeout)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, unavailable)
