"""A ledger write lost to another writer is decided and written again; other failures end it at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sandfleet.core.leases import LeaseRecord
from sandfleet.core.ledger import Claim
from sandfleet.kube.errors import KubeError
from sandfleet.kube.ledger import MAX_ATTEMPTS, LedgerBook, LedgerUnavailable


class RivalWrites:
    """An apiserver where another writer creates the shard's ledger first, `conflicts` times over."""

    def __init__(self, conflicts: int, failure: KubeError | None = None) -> None:
        self.conflicts = conflicts
        self.failure = failure
        self.calls: list[str] = []

    async def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(method)
        await asyncio.sleep(0)
        if method == "GET":  # the rival's ledger is gone again by the time it is read
            raise KubeError(404, "not found")
        assert method == "POST", method
        if self.failure is not None:
            raise self.failure
        if self.conflicts > 0:
            self.conflicts -= 1
            raise KubeError(409, "already exists")
        body: dict[str, Any] = kwargs["body"]
        return {**body, "metadata": {**body["metadata"], "resourceVersion": "7"}}


def claim(pod: str = "p-1") -> Claim:
    record = LeaseRecord(f"ns.{pod}", "python", "alice", 100.0, 160.0, 60)
    return Claim(pod, 0, record)


async def submit(kube: RivalWrites) -> LedgerBook:
    book = LedgerBook(kube, ["ns"], lambda *_: None, clock=lambda: 100.0)  # type: ignore[arg-type]
    entry = await book.submit("ns", "0", claim())
    assert entry is not None
    assert entry.lease is not None
    assert entry.lease.holder == "alice"
    return book


async def test_a_write_lost_to_another_writer_is_read_and_made_again() -> None:
    kube = RivalWrites(conflicts=3)
    book = await submit(kube)
    assert kube.calls == ["POST", "GET"] * 3 + ["POST"]
    assert book.writes == 1
    ledger = book.ledger("ns", "0")
    assert ledger is not None
    assert ledger.resource_version == "7"


async def test_a_batch_gives_up_after_its_attempts_all_lost(caplog: pytest.LogCaptureFixture) -> None:
    kube = RivalWrites(conflicts=MAX_ATTEMPTS)
    with pytest.raises(LedgerUnavailable, match=f"{MAX_ATTEMPTS} conflicts in a row"):
        await submit(kube)
    assert kube.calls == ["POST", "GET"] * MAX_ATTEMPTS
    assert f"a write of 1 operations failed ({MAX_ATTEMPTS} conflicts in a row)" in caplog.text


async def test_any_other_failure_ends_the_write_at_once() -> None:
    kube = RivalWrites(conflicts=0, failure=KubeError(500, "etcdserver: request timed out"))
    with pytest.raises(LedgerUnavailable, match="KubeError: 500: etcdserver: request timed out"):
        await submit(kube)
    assert kube.calls == ["POST"]
