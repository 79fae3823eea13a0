"""Leases as plain data: what a lease holds, how it is written on a Pod, and when it has ended."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from sandfleet.core import api


class LeaseError(ValueError):
    """A lease request that cannot be honoured, with what to do about it."""


def lease_expired(expires_at: float | None, now: float) -> bool:
    """The one expiry rule: a lease ends at its expiry instant (inclusive); no expiry never ends."""
    return expires_at is not None and now >= expires_at


@dataclass(frozen=True)
class LeaseRecord:
    """The exclusive right to one sandbox for one episode, until `expires_at` (unix seconds).

    This is the record the gateway writes on the sandbox's Pod (`api.LEASE_ANNOTATION`); the
    client's view of a lease is `sandfleet.client.Lease`.
    """

    id: str
    pool: str
    holder: str
    acquired_at: float
    expires_at: float
    ttl_seconds: int
    labels: dict[str, str] = field(default_factory=dict)
    idempotency_key: str | None = None
    policy_version: int | None = None
    # The acquire attempt that claimed (or a retry that adopted) it: one answer's leases share it.
    attempt: str | None = None
    # What the keyed acquire that claimed it asked for (lease_keys.request_fingerprint): a retry
    # with the key must ask for the same. None on leases without a key, or of older gateways.
    request: str | None = None

    @property
    def run(self) -> str | None:
        return self.labels.get("run")

    def expired(self, now: float) -> bool:
        return lease_expired(self.expires_at, now)

    def renewed(self, now: float, ttl_seconds: int) -> LeaseRecord:
        return replace(self, expires_at=now + ttl_seconds, ttl_seconds=ttl_seconds)


def choose_ttl(requested: int | None, default_ttl: int, max_ttl: int) -> int:
    """The TTL a lease gets: the pool's default when none is asked for, never above the pool's max."""
    if requested is None:
        return default_ttl
    if requested <= 0:
        raise LeaseError(f"ttl_seconds must be positive, got {requested}")
    if requested > max_ttl:
        raise LeaseError(
            f"ttl_seconds {requested} is above this pool's maximum of {max_ttl}: "
            "ask for less and renew while the episode runs"
        )
    return requested


def lease_metadata(lease: LeaseRecord) -> dict[str, Any]:
    """The labels and annotations that put `lease` on a sandbox Pod (a merge-patch body)."""
    labels: dict[str, str | None] = {api.LEASE_STATE_LABEL: api.LEASE_LEASED}
    labels[api.RUN_LABEL] = lease.run if lease.run and _label_safe(lease.run) else None
    key = lease.idempotency_key
    labels[api.LEASE_KEY_LABEL] = lease_key_label(lease.holder, key) if key else None
    return {
        "labels": labels,
        "annotations": {
            api.LEASE_ANNOTATION: json.dumps(asdict(lease), sort_keys=True),
            api.RESERVED_ANNOTATION: None,
            # The expiry is written once, inside the record. Versions before it also wrote this
            # annotation: removing it means an operator of that version never reads a stale expiry.
            api.LEASE_EXPIRES_ANNOTATION: None,
        },
    }


def lease_key_label(holder: str, idempotency_key: str) -> str:
    """The LEASE_KEY_LABEL value of a lease `holder` acquired with `idempotency_key` (a label-safe hash)."""
    return hashlib.sha256(f"{holder}\n{idempotency_key}".encode()).hexdigest()[:40]


def release_metadata() -> dict[str, Any]:
    """The merge-patch body that marks a Pod's lease released (the operator then deletes it)."""
    return {"labels": {api.LEASE_STATE_LABEL: api.LEASE_RELEASED}}


def reserve_metadata(holder: str, run: str, episodes: int, now: float) -> dict[str, Any]:
    """The merge-patch body that ends a lease on a reset Pod and keeps it for the run's next lease.

    The run label stays (kubectl shows whose it is); the lease and its key go, as on an unclaim.
    """
    return {
        "labels": {api.LEASE_STATE_LABEL: api.LEASE_RESERVED, api.LEASE_KEY_LABEL: None},
        "annotations": {
            api.LEASE_ANNOTATION: None,
            api.LEASE_EXPIRES_ANNOTATION: None,
            api.EPISODES_ANNOTATION: str(episodes),
            api.RESERVED_ANNOTATION: json.dumps({"holder": holder, "run": run, "since": now}, sort_keys=True),
        },
    }


def reservation_from_annotations(
    annotations: dict[str, str] | None,
) -> tuple[tuple[str, str], float] | None:
    """((holder, run), since) of a reserved Pod, or None if it has none (or an unreadable one)."""
    raw = (annotations or {}).get(api.RESERVED_ANNOTATION)
    if not raw:
        return None
    try:
        data = json.loads(raw)
        return (str(data["holder"]), str(data["run"])), float(data["since"])
    except (TypeError, ValueError, KeyError):
        return None


def episodes_from_annotations(annotations: dict[str, str] | None) -> int:
    """How many episodes a Pod has served and been reset after (0 when never, or unreadable)."""
    raw = (annotations or {}).get(api.EPISODES_ANNOTATION, "0")
    return int(raw) if raw.isdigit() and len(raw) < 10 else 0


def unclaim_metadata() -> dict[str, Any]:
    """The merge-patch body that takes a lease nobody received off a Pod: it is warm again."""
    return {
        "labels": {api.LEASE_STATE_LABEL: api.LEASE_FREE, api.RUN_LABEL: None, api.LEASE_KEY_LABEL: None},
        "annotations": {api.LEASE_ANNOTATION: None, api.LEASE_EXPIRES_ANNOTATION: None},
    }


def lease_from_annotations(annotations: dict[str, str] | None) -> LeaseRecord | None:
    """The lease recorded on a Pod, or None if it has none (or an unreadable one)."""
    raw = (annotations or {}).get(api.LEASE_ANNOTATION)
    if not raw:
        return None
    try:
        return lease_from_json(json.loads(raw))
    except (TypeError, ValueError):
        return None


def lease_from_json(data: Any) -> LeaseRecord:
    """A LeaseRecord from its JSON object (TypeError or ValueError when it is not one).

    Fields a newer gateway added are left out, so a rolling upgrade never hides a lease.
    """
    if not isinstance(data, dict):
        raise TypeError("a lease record is a JSON object")
    record = LeaseRecord(**{name: data[name] for name in _RECORD_FIELDS if name in data})
    # JSON has no tuples or frozen dicts: what comes back must compare equal to what was written.
    return replace(record, labels=dict(record.labels))


_RECORD_FIELDS = tuple(f.name for f in fields(LeaseRecord))


def _label_safe(value: str) -> bool:
    return (
        0 < len(value) <= 63
        and value[0].isalnum()
        and value[-1].isalnum()
        and all(c.isalnum() or c in "-_." for c in value)
    )
