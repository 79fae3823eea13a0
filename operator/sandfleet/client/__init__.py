"""The typed Python client, async and sync: lease sandboxes, run commands, move files, evaluate.

    async with AsyncFleet() as fleet:      # SANDFLEET_URL, SANDFLEET_TOKEN (or SANDFLEET_TOKEN_FILE)
        async with fleet.lease(pool="python", labels={"run": "r1"}) as sb:
            result = await sb.exec(["python", "-c", "print(6 * 7)"])

The blocking client (`Fleet`, `Sandbox`) is the async one run on a private event-loop thread:
every call is written once, in `AsyncFleet` and `AsyncSandbox`. It speaks HTTP only, in
sandfleet.wire's words. Its modules, bottom up: `errors` (a typed error per failure), `sending`
(the gateway, the token, one call and its retries), `results` (Lease, ExecResult, Evaluation),
`calls` (the bodies that take building), `async_fleet`, `blocking`. Import from here.
"""

from sandfleet.client.async_fleet import AsyncFleet, AsyncSandbox
from sandfleet.client.blocking import Fleet, Sandbox
from sandfleet.client.calls import SpanReport
from sandfleet.client.errors import (
    RETRYABLE,
    Forbidden,
    LeaseEnded,
    NoSandboxInTime,
    NotFound,
    PolicyConflict,
    QueueFull,
    SandboxError,
    SandboxLost,
    SandfleetError,
    Unauthorized,
    Unavailable,
    error_for,
)
from sandfleet.client.results import Evaluation, ExecResult, Lease
from sandfleet.client.sending import DEFAULT_URL, Call, TokenFile

# Re-exported: callers read `Evaluation.outcome` as `sandfleet.client.Outcome`.
from sandfleet.wire import Outcome

__all__ = [
    "DEFAULT_URL",
    "RETRYABLE",
    "AsyncFleet",
    "AsyncSandbox",
    "Call",
    "Evaluation",
    "ExecResult",
    "Fleet",
    "Forbidden",
    "Lease",
    "LeaseEnded",
    "NoSandboxInTime",
    "NotFound",
    "Outcome",
    "PolicyConflict",
    "QueueFull",
    "Sandbox",
    "SandboxError",
    "SandboxLost",
    "SandfleetError",
    "SpanReport",
    "TokenFile",
    "Unauthorized",
    "Unavailable",
    "error_for",
]
