"""Per-tenant quotas and pool capacity: which requests are refused at once, and what they are told."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.quotas import (
    CapacityError,
    QuotaExceeded,
    Quotas,
    check_batch,
    check_group,
    check_leases,
    check_prefetch,
)

QUOTAS = Quotas(max_leases_per_tenant=10, max_group_size=8, max_prefetch_per_tenant=20)


def test_a_group_larger_than_the_pool_can_ever_hold_names_the_pools_max() -> None:
    with pytest.raises(CapacityError, match="holds at most 64") as error:
        check_group(205, "python", 64, Quotas())
    assert error.value.code == "group_too_large"


def test_a_group_above_the_tenant_quota_names_the_setting() -> None:
    with pytest.raises(CapacityError, match="SANDFLEET_GATEWAY_MAX_GROUP_SIZE"):
        check_group(9, "python", 100, QUOTAS)
    check_group(8, "python", 8, QUOTAS)


@given(st.integers(0, 20), st.integers(0, 20), st.integers(1, 20))
def test_the_lease_quota_counts_held_pending_and_asked(held: int, pending: int, count: int) -> None:
    if held + pending + count > QUOTAS.max_leases_per_tenant:
        with pytest.raises(QuotaExceeded, match="release leases"):
            check_leases("alice", held, pending, count, QUOTAS)
    else:
        check_leases("alice", held, pending, count, QUOTAS)


def test_a_prefetch_past_the_quota_or_the_pool_is_refused_not_clamped() -> None:
    with pytest.raises(CapacityError, match="prefetch quota is 20"):
        check_prefetch([15, 6], "python", 1000, QUOTAS)
    with pytest.raises(CapacityError, match="holds at most 16"):
        check_prefetch([10, 7], "python", 16, QUOTAS)
    check_prefetch([10, 6], "python", 16, QUOTAS)


def test_a_batch_is_refused_above_its_quota_above_the_lease_quota_or_when_its_minimum_cannot_fit() -> None:
    quotas = Quotas(max_leases_per_tenant=5000, max_batch_size=4096)
    with pytest.raises(CapacityError, match="SANDFLEET_GATEWAY_MAX_BATCH_SIZE") as error:
        check_batch(4097, 1, "python", 10_000, quotas)
    assert error.value.code == "batch_too_large"
    with pytest.raises(CapacityError, match=r"lease quota of 10 .*ask for at most 10"):
        check_batch(11, 1, "python", 100, QUOTAS)
    with pytest.raises(CapacityError, match="set min_count to at most 64"):
        check_batch(100, 65, "python", 64, quotas)
    check_batch(4096, 64, "python", 64, quotas)  # up to 4,096 from a pool of 64: it takes what it gets


def test_quotas_are_at_least_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Quotas(max_leases_per_tenant=0)
