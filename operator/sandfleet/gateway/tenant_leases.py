"""Each tenant's leases, held and waited for: what its lease quota is checked against."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from sandfleet.core import api
from sandfleet.core.model import SandboxPod
from sandfleet.core.quotas import Quotas, check_leases
from sandfleet.gateway.backend import Backend


class TenantLeases:
    """Per tenant, the sandboxes seen leased to it and the count it waits for.

    The sandboxes are a superset (deletions are not announced), so its entries are checked against
    the backend before a quota is refused.
    """

    def __init__(self, backend: Backend, clock: Callable[[], float], quotas: Quotas) -> None:
        self.backend = backend
        self.clock = clock
        self.quotas = quotas
        self._held: dict[str, set[str]] = {}
        self._holder_of: dict[str, str] = {}
        self._pending: dict[str, int] = {}

    @contextlib.contextmanager
    def acquiring(self, holder: str, count: int) -> Iterator[None]:
        """Within the quota (else QuotaExceeded), `count` more waited for by `holder` until the block ends."""
        self._check_lease_quota(holder, count)
        self._pending[holder] = self._pending.get(holder, 0) + count
        try:
            yield
        finally:
            left = self._pending[holder] - count
            if left:
                self._pending[holder] = left
            else:
                del self._pending[holder]

    def track(self, sandbox: SandboxPod) -> None:
        """File `sandbox` under the tenant leasing it now (if any), and no longer under another."""
        lease = sandbox.lease
        holder = lease.holder if lease is not None and sandbox.state == api.LEASE_LEASED else None
        known = self._holder_of.get(sandbox.key)
        if known == holder:
            return
        if known is not None:
            keys = self._held.get(known)
            if keys is not None:
                keys.discard(sandbox.key)
                if not keys:
                    del self._held[known]
            del self._holder_of[sandbox.key]
        if holder is not None:
            self._held.setdefault(holder, set()).add(sandbox.key)
            self._holder_of[sandbox.key] = holder

    def _check_lease_quota(self, holder: str, count: int) -> None:
        pending = self._pending.get(holder, 0)
        limit = self.quotas.max_leases_per_tenant
        if len(self._held.get(holder, ())) + pending + count > limit:
            check_leases(holder, self._held_now(holder), pending, count, self.quotas)

    def _held_now(self, holder: str) -> int:
        """The tenant's live leases, exactly: its index entries checked (and pruned) one by one."""
        now = self.clock()
        keys = self._held.get(holder, set())
        for key in list(keys):
            sandbox = self.backend.sandbox(key)
            lease = sandbox.lease if sandbox is not None else None
            if (
                sandbox is None
                or lease is None
                or sandbox.state != api.LEASE_LEASED
                or lease.holder != holder
                or lease.expired(now)
            ):
                keys.discard(key)
                self._holder_of.pop(key, None)
        if not keys:
            self._held.pop(holder, None)
        return len(keys)
