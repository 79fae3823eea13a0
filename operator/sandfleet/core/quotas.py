"""Per-tenant capacity rules: how many leases one caller may hold, group, batch and prefetch sizes."""

from __future__ import annotations

from dataclasses import dataclass


class CapacityError(ValueError):
    """A request no pool or quota could ever serve as asked: the message says which limit and what to do."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class QuotaExceeded(RuntimeError):
    """A request that would take a tenant past its quota now; it may succeed once leases are released."""

    def __init__(self, message: str, retry_after_seconds: int = 5) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


@dataclass(frozen=True)
class Quotas:
    """The limits every tenant (authenticated caller) is held to; one set for all tenants."""

    max_leases_per_tenant: int = 2000  # live leases plus sandboxes still being acquired
    max_group_size: int = 256  # sandboxes in one acquire
    max_prefetch_per_tenant: int = 1024  # warm sandboxes one prefetch call may ask for, all images
    max_batch_size: int = 4096  # sandboxes one batch acquire may ask for (a step's batch)

    def __post_init__(self) -> None:
        limits = (self.max_leases_per_tenant, self.max_group_size, self.max_prefetch_per_tenant)
        if min(*limits, self.max_batch_size) < 1:
            raise ValueError("every quota must be at least 1")


def check_group(count: int, pool: str, pool_capacity: int, quotas: Quotas) -> None:
    """Refuse at once a group that can never be served: larger than the quota or than the pool."""
    if count > pool_capacity:
        raise CapacityError(
            "group_too_large",
            f"pool {pool!r} holds at most {pool_capacity} sandboxes, so a group of {count} can never "
            f"be served: ask for at most {pool_capacity}, or raise the pool's maxSandboxes",
        )
    if count > quotas.max_group_size:
        raise CapacityError(
            "group_too_large",
            f"a group of {count} is above the per-tenant group quota of {quotas.max_group_size} "
            "(SANDFLEET_GATEWAY_MAX_GROUP_SIZE): split it into smaller acquires",
        )


def check_batch(count: int, min_count: int, pool: str, pool_capacity: int, quotas: Quotas) -> None:
    """Refuse at once a batch (up to `count`, at least `min_count`) that can never be served.

    Only its minimum must fit the pool: a batch asks for up to `count` and takes what it gets. Its
    maximum must fit the batch and lease quotas, since it is counted against the lease quota whole.
    """
    if count > quotas.max_batch_size:
        raise CapacityError(
            "batch_too_large",
            f"a batch of up to {count} is above the batch quota of {quotas.max_batch_size} "
            "(SANDFLEET_GATEWAY_MAX_BATCH_SIZE): split it into smaller batches",
        )
    if count > quotas.max_leases_per_tenant:
        raise CapacityError(
            "batch_too_large",
            f"a batch of up to {count} is above the per-tenant lease quota of "
            f"{quotas.max_leases_per_tenant} (SANDFLEET_GATEWAY_MAX_LEASES_PER_TENANT), so it could "
            f"never be granted: ask for at most {quotas.max_leases_per_tenant}",
        )
    if min_count > pool_capacity:
        raise CapacityError(
            "batch_too_large",
            f"pool {pool!r} holds at most {pool_capacity} sandboxes, so a batch of at least {min_count} "
            f"can never be served: set min_count to at most {pool_capacity}, or raise the pool's "
            "maxSandboxes",
        )


def check_leases(tenant: str, held: int, pending: int, count: int, quotas: Quotas) -> None:
    """Refuse an acquire that would take `tenant` past its lease quota (held + pending + count)."""
    limit = quotas.max_leases_per_tenant
    if held + pending + count > limit:
        raise QuotaExceeded(
            f"tenant {tenant!r} holds {held} leases and is acquiring {pending} more; {count} more would "
            f"pass its quota of {limit} (SANDFLEET_GATEWAY_MAX_LEASES_PER_TENANT): release leases "
            "(DELETE /v1/leases/{id} or POST /v1/runs/{run}/release) and retry"
        )


def check_prefetch(counts: list[int], pool: str, pool_capacity: int, quotas: Quotas) -> None:
    """Refuse (not clamp) a prefetch above the tenant's quota or the pool's capacity.

    Refused rather than clamped so the caller learns its lookahead will not all be warm.
    """
    total = sum(counts)
    if total > quotas.max_prefetch_per_tenant:
        raise CapacityError(
            "prefetch_too_large",
            f"this prefetch asks for {total} warm sandboxes; the per-tenant prefetch quota is "
            f"{quotas.max_prefetch_per_tenant} (SANDFLEET_GATEWAY_MAX_PREFETCH_PER_TENANT): "
            "prefetch a shorter lookahead",
        )
    if total > pool_capacity:
        raise CapacityError(
            "prefetch_too_large",
            f"pool {pool!r} holds at most {pool_capacity} sandboxes; a prefetch of {total} can "
            f"never all be warm: ask for at most {pool_capacity} in all",
        )
