"""Which sandboxes carry a lease with a given (holder, idempotency key), kept current per change."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

from sandfleet.core.leases import LeaseRecord
from sandfleet.core.model import SandboxPod

KeyOwner = tuple[str, str]  # (holder, idempotency key)


def key_owner(holder: str, idempotency_key: str) -> KeyOwner:
    """Where a lease's key is filed: the pair itself, never a joined string.

    Joined with a separator, tenant `alice/x` with key `y` and tenant `alice` with key `x/y` would be
    one entry, and one tenant's retry would join (and get the leases of) another tenant's acquire.
    """
    return (holder, idempotency_key)


def request_fingerprint(
    *,
    pool: str,
    image: str | None,
    count: int,
    least: int,
    ttl_seconds: int | None,
    labels: Mapping[str, str],
    regions: Sequence[str],
    policy_version: int | None,
) -> str:
    """A short hash of what a keyed acquire asked for (all but how long it waits).

    A retry sends the same body again; the same key with another body is a different request, and
    answering it with the first one's leases (or adding to them) would answer a question it did not
    ask.
    """
    asked = [pool, image, count, least, ttl_seconds, sorted(labels.items()), list(regions), policy_version]
    return hashlib.sha256(json.dumps(asked, separators=(",", ":")).encode()).hexdigest()[:16]


def asked_otherwise(leases: Sequence[LeaseRecord], fingerprint: str) -> bool:
    """Whether a key's live leases were claimed for a request other than `fingerprint`."""
    return any(lease.request is not None and lease.request != fingerprint for lease in leases)


def still_to_claim(count: int, least: int, found: int) -> tuple[int, int]:
    """What a retried acquire must still claim, (count, least), after adopting `found` live leases.

    (0, 0) when what it found is at least its minimum: those are its answer. Fewer means no
    attempt was ever answered with them (its replica died mid-claim, or some have ended since):
    the retry keeps them and claims the rest, the minimum lowered by what it already holds.
    """
    if found >= least:
        return (0, 0)
    return (count - found, least - found)


def adoptable(leases: Sequence[LeaseRecord], count: int, least: int) -> list[LeaseRecord]:
    """Which of a key's live leases a retry takes over: an answer already given, or what no one got.

    Every lease carries the attempt that claimed or last adopted it, so an answered attempt's
    leases share one id. An attempt holding at least `least` was answered (or would have been, had
    its replica lived): its leases alone are the answer, the newest such attempt's if several.
    Leases of other attempts beside it are claims a dead replica made that its caller never got
    (they reached the Pods after the retry looked): handing them out now would change an answer
    already given, so they stay out and end at their TTL. With no attempt that far, nobody was
    answered: the retry takes them all, oldest first, up to `count`.
    """
    attempts: dict[str | None, list[LeaseRecord]] = {}
    for lease in leases:
        attempts.setdefault(lease.attempt, []).append(lease)
    answered = [held for held in attempts.values() if len(held) >= least]
    taken = max(answered, key=lambda held: max(lease.acquired_at for lease in held)) if answered else leases
    return sorted(taken, key=lambda lease: (lease.acquired_at, lease.id))[:count]


class LeaseKeys:
    """Sandboxes by the idempotency key of the lease on them, so a retried acquire is O(1), not a scan."""

    def __init__(self) -> None:
        self._by_key: dict[KeyOwner, dict[str, SandboxPod]] = {}
        self._owner: dict[str, KeyOwner] = {}  # sandbox key -> where it is filed

    def update(self, sandbox: SandboxPod) -> None:
        """A sandbox was added or changed: file it under its lease's key (or nowhere)."""
        self.remove(sandbox.key)
        lease = sandbox.lease
        if lease is not None and lease.idempotency_key:
            owner = key_owner(lease.holder, lease.idempotency_key)
            self._by_key.setdefault(owner, {})[sandbox.key] = sandbox
            self._owner[sandbox.key] = owner

    def remove(self, key: str) -> None:
        owner = self._owner.pop(key, None)
        if owner is None:
            return
        filed = self._by_key[owner]
        del filed[key]
        if not filed:
            del self._by_key[owner]

    def clear(self) -> None:
        self._by_key.clear()
        self._owner.clear()

    def find(self, holder: str, idempotency_key: str) -> list[SandboxPod]:
        """The sandboxes whose current lease was acquired by `holder` with `idempotency_key`."""
        return list(self._by_key.get(key_owner(holder, idempotency_key), {}).values())
