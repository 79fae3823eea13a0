"""Why a lease call fails: the lease service's errors, each answered to the caller as what to do."""

from __future__ import annotations

from sandfleet.core.queueing import Admission


class UnknownName(LookupError):
    """No pool, lease or run by that name, or no pool for an image (the client sees `NotFound`)."""


class LeaseGone(LookupError):
    """The lease existed but has ended (released or expired): its sandbox is not coming back.

    The client sees `LeaseEnded`; `sandfleet.kube.errors.Gone` is the apiserver's 410.
    """

    # Who held it, where the backend raising it knows better than the caller's view (a lease lost
    # with its fleet member): only that holder is told why, so a stranger learns nothing of the member.
    holder: str | None = None


class SandboxWithdrawn(RuntimeError):
    """A claim the backend gave up on, nobody getting the sandbox: its cluster is away.

    The backend (gateway.fleet) took that cluster's warm sandboxes off the shelves, so the waiter
    takes another instead of failing. It never reaches a caller.
    """


class NotTheHolder(PermissionError):
    """The caller may not touch this lease: another caller holds it (the client sees `Forbidden`)."""


class KeyReused(ValueError):
    """The idempotency key is in use for a different request (422)."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"idempotency key {key!r} is in use for a different request (its pool, image, count, "
            "min_count, ttl_seconds, labels, regions or policy_version differ): to retry that request, "
            "send exactly its body again; for a new request, use a new key (a key is free again once "
            "its leases have ended)"
        )


class PoolQueueFull(RuntimeError):
    """Too many callers are already waiting for this pool (the client sees `QueueFull`)."""

    def __init__(self, pool: str, admission: Admission) -> None:
        super().__init__(
            f"pool {pool!r} has {admission.position - 1} callers waiting already; "
            f"retry in {admission.retry_after_seconds}s"
        )
        self.admission = admission


class WaitTimeout(TimeoutError):
    """No sandbox became free within the caller's wait."""

    def __init__(self, pool: str, position: int, eta_seconds: float) -> None:
        super().__init__(
            f"no warm sandbox in pool {pool!r} within the wait; you were number {position} "
            f"in the queue, estimated {eta_seconds:.1f}s more"
        )
        self.position = position
        self.eta_seconds = eta_seconds
