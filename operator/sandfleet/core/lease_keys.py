"""Which sandboxes carry a lease with a given (holder, idempotency key), kept current per change."""

from __future__ import annotations

from sandfleet.core.model import SandboxPod

KeyOwner = tuple[str, str]  # (holder, idempotency key)


def key_owner(holder: str, idempotency_key: str) -> KeyOwner:
    """Where a lease's key is filed: the pair itself, never a joined string.

    Joined with a separator, tenant `alice/x` with key `y` and tenant `alice` with key `x/y` would be
    one entry, and one tenant's retry would join (and get the leases of) another tenant's acquire.
    """
    return (holder, idempotency_key)


def still_to_claim(count: int, least: int, found: int) -> tuple[int, int]:
    """What a retried acquire must still claim, (count, least), after adopting `found` live leases.

    (0, 0) when what it found is at least its minimum: those are its answer. Fewer means no
    attempt was ever answered with them (its replica died mid-claim, or some have ended since):
    the retry keeps them and claims the rest, the minimum lowered by what it already holds.
    """
    if found >= least:
        return (0, 0)
    return (count - found, least - found)


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
