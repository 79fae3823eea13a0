"""What an acquire asks for (`LeaseRequest`) and what it is granted (`Granted`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sandfleet.core.leases import LeaseRecord
from sandfleet.core.model import SandboxPod


@dataclass(frozen=True)
class LeaseRequest:
    """What a caller asks for (already validated by the API layer)."""

    pool: str
    holder: str
    image: str | None = None  # a task image (pre-warmed by prefetch); the pool's own when None
    count: int = 1
    regions: tuple[str, ...] = ()
    ttl_seconds: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    idempotency_key: str | None = None
    policy_version: int | None = None
    wait_seconds: float = 30.0
    min_count: int | None = None  # below `count`: a batch (up to count); None or count: a group
    attempt: str | None = None  # set per keyed attempt: the leases it claims carry it
    # The caller made the key for this request and never sent it before (the client's first try of
    # a key it generated): no earlier attempt can have claimed anything under it, so nothing needs
    # reading back. A caller that says so wrongly only gets fresh leases for its own retry.
    fresh_key: bool = False
    asked: str | None = None  # set on a keyed request: its request_fingerprint, on every lease it claims

    @property
    def least(self) -> int:
        """The fewest sandboxes this request accepts: `count` for a group, `min_count` for a batch."""
        return self.count if self.min_count is None else min(self.min_count, self.count)

    @property
    def batch(self) -> bool:
        return self.least < self.count


@dataclass(frozen=True)
class Granted:
    """Leases handed out, with where the time went."""

    leases: list[tuple[LeaseRecord, SandboxPod]]
    queue_seconds: float  # waiting, less the boot time below
    claim_seconds: float
    position: int  # place in the queue on arrival; 0 when served at once
    boot_seconds: float = 0.0  # of the wait, the time the sandbox it got was still booting (cold)
