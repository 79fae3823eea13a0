"""Idempotency keys are per tenant: no (holder, key) pair can be spelled as another one."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.lease_keys import key_owner
from sandfleet.gateway.leasing import LeaseRequest, LeaseService
from tests.support.backends import MemoryBackend

names = st.text(alphabet="ab/:-", min_size=0, max_size=6)


@given(names, names, names, names)
def test_distinct_holder_and_key_pairs_never_share_a_slot(h1: str, k1: str, h2: str, k2: str) -> None:
    assert (key_owner(h1, k1) == key_owner(h2, k2)) == ((h1, k1) == (h2, k2))


async def test_a_tenant_cannot_join_another_tenants_acquire_by_spelling_its_key() -> None:
    backend = MemoryBackend()
    service = LeaseService(backend)

    def request(holder: str, key: str) -> LeaseRequest:
        return LeaseRequest(pool="python", holder=holder, idempotency_key=key, wait_seconds=5)

    # Both wait in the queue: `alice/x` + `y` and `alice` + `x/y` once joined to the same string.
    victim = asyncio.ensure_future(service.acquire(request("alice/x", "y")))
    await asyncio.sleep(0.01)
    intruder = asyncio.ensure_future(service.acquire(request("alice", "x/y")))
    await asyncio.sleep(0.01)
    backend.add("s0")
    backend.add("s1")
    theirs, mine = await asyncio.gather(victim, intruder)
    assert [lease.holder for lease, _ in theirs.leases] == ["alice/x"]
    assert [lease.holder for lease, _ in mine.leases] == ["alice"]
    assert theirs.leases[0][0].id != mine.leases[0][0].id
