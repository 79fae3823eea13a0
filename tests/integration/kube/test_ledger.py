"""Lease ledgers on the real apiserver: group commit, two writers racing, and a consistent refresh."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sandfleet.core import api
from sandfleet.core.leases import LeaseRecord
from sandfleet.core.ledger import (
    TOMBSTONE_SECONDS,
    UNREADABLE,
    Claim,
    LedgerEntry,
    Release,
    Rewrite,
    Unclaim,
    is_tombstone,
    ledger_object,
    stored_entries,
)
from sandfleet.kube.api_calls import KubeClient
from sandfleet.kube.config import api_client, load_configuration
from sandfleet.kube.ledger import LedgerBook, LedgerUnavailable
from tests.support.kube import Kubectl

pytestmark = pytest.mark.cluster


@pytest.fixture
async def kube(kubectl: Kubectl, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[KubeClient]:
    monkeypatch.setenv("KUBECONFIG", str(kubectl.kubeconfig))
    client = KubeClient(api_client(await load_configuration(), 16))
    yield client
    await client.close()


async def started(kube: KubeClient, namespace: str, clock: Callable[[], float] = time.time) -> LedgerBook:
    book = LedgerBook(kube, (namespace,), lambda *_: None, clock=clock)
    await book.start()
    await asyncio.wait_for(book.synced.wait(), 30)
    return book


def lease(namespace: str, pod: str, holder: str) -> LeaseRecord:
    return LeaseRecord(f"{namespace}.{pod}", "python", holder, 100.0, 4_000_000_000.0, 3600)


def ledger_writes(kubectl: Kubectl) -> dict[str, float]:
    """The apiserver's own count of writes to sandboxledgers, by verb and code."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(kubectl("get", "--raw", "/metrics")):
        for sample in family.samples:
            labels = sample.labels
            if sample.name != "apiserver_request_total" or labels.get("resource") != api.LEDGER_PLURAL:
                continue
            if labels["verb"] in ("POST", "PATCH"):
                key = f"{labels['verb']} {labels['code']}"
                counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


async def test_a_batch_of_claims_is_one_write(kube: KubeClient, kubectl: Kubectl, namespace: str) -> None:
    book = await started(kube, namespace)
    try:
        before = ledger_writes(kubectl)
        claims = [Claim(f"sb-{i}", 0, lease(namespace, f"sb-{i}", "alice")) for i in range(300)]
        results = await asyncio.gather(*(book.submit(namespace, "00", claim) for claim in claims))
        assert all(isinstance(entry, LedgerEntry) and entry.state == api.LEASE_LEASED for entry in results)
        assert delta(ledger_writes(kubectl), before) == {"POST 201": 1.0}  # the ledger's create holds all
        stored = kubectl.json("-n", namespace, "get", api.LEDGER_PLURAL, "sandfleet-ledger-00")
        assert len(stored_entries(stored) or {}) == stored["spec"]["count"] == 300
        before = ledger_writes(kubectl)
        released = await asyncio.gather(
            *(book.submit(namespace, "00", Release(f"sb-{i}", f"{namespace}.sb-{i}")) for i in range(300))
        )
        assert all(entry is not None and entry.state == api.LEASE_RELEASED for entry in released)
        assert delta(ledger_writes(kubectl), before) == {"PATCH 200": 1.0}
    finally:
        await book.stop()


async def test_two_writers_racing_for_the_same_pods_never_both_win(
    kube: KubeClient, kubectl: Kubectl, namespace: str
) -> None:
    """Two replicas claim overlapping Pods, each from its own view: each Pod goes to exactly one."""
    first, second = await started(kube, namespace), await started(kube, namespace)
    try:
        # The ledger exists already, at the same version for both (a create race is the other case).
        await first.submit(namespace, "01", Claim("seed", 0, lease(namespace, "seed", "nobody")))
        await asyncio.gather(second.read(namespace, "01"), first.read(namespace, "01"))
        before = ledger_writes(kubectl)

        async def claim(book: LedgerBook, holder: str, pods: range) -> dict[str, Any]:
            claims = [Claim(f"sb-{i}", 0, lease(namespace, f"sb-{i}", holder)) for i in pods]
            done = await asyncio.gather(*(book.submit(namespace, "01", c) for c in claims))
            return {c.pod: entry for c, entry in zip(claims, done, strict=True)}

        # sb-25 ... sb-49 are wanted by both.
        alice, bob = await asyncio.gather(
            claim(first, "alice", range(50)), claim(second, "bob", range(25, 75))
        )
        for i in range(25, 50):
            won = (alice[f"sb-{i}"] is not None, bob[f"sb-{i}"] is not None)
            assert won in ((True, False), (False, True)), f"sb-{i}: alice {won[0]}, bob {won[1]}"
        assert all(alice[f"sb-{i}"] is not None for i in range(25))  # nobody else wanted these
        assert all(bob[f"sb-{i}"] is not None for i in range(50, 75))
        stored = await first.read(namespace, "01")
        assert stored is not None
        holders = {pod: e.lease.holder for pod, e in stored.entries.items() if e.lease and pod != "seed"}
        expected = {pod: "bob" for pod, entry in bob.items() if entry is not None}
        expected.update({pod: "alice" for pod, entry in alice.items() if entry is not None})
        assert holders == expected
        writes = delta(ledger_writes(kubectl), before)
        assert writes.get("PATCH 409", 0) >= 1, writes  # the loser's first write was refused ...
        assert writes.get("PATCH 200", 0) >= 2, writes  # ... and it wrote the rest again, decided afresh
    finally:
        await first.stop()
        await second.stop()


async def test_a_renewal_decided_on_an_old_entry_is_refused(kube: KubeClient, namespace: str) -> None:
    book = await started(kube, namespace)
    try:
        held = await book.submit(namespace, "02", Claim("sb", 0, lease(namespace, "sb", "alice")))
        assert held is not None
        assert held.lease is not None
        renewed = held.lease.renewed(200.0, 3600)
        assert await book.submit(namespace, "02", Rewrite("sb", held.rev, renewed)) is not None
        assert await book.submit(namespace, "02", Rewrite("sb", held.rev, renewed.renewed(300.0, 60))) is None
    finally:
        await book.stop()


async def test_a_refresh_sees_another_writers_commits_before_its_watch_does(
    kube: KubeClient, namespace: str
) -> None:
    writer, reader = await started(kube, namespace), await started(kube, namespace)
    try:
        await writer.submit(namespace, "03", Claim("sb", 0, lease(namespace, "sb", "alice")))
        await reader.refresh(namespace)  # right after the commit: the watch may not have it yet
        entry = reader.entry(namespace, "03", "sb")
        assert entry is not None
        assert entry.state == api.LEASE_LEASED
    finally:
        await writer.stop()
        await reader.stop()


async def test_a_ledger_nobody_can_read_holds_every_pod_and_is_never_overwritten(
    kube: KubeClient, kubectl: Kubectl, namespace: str
) -> None:
    damaged = ledger_object(namespace, "04", {})
    damaged["spec"]["entries"] = "not gzip, not base64"
    kubectl.in_namespace(namespace).apply(damaged)
    book = await started(kube, namespace)
    try:
        assert book.entry(namespace, "04", "sb") == UNREADABLE
        with pytest.raises(LedgerUnavailable, match="cannot be read"):
            await book.submit(namespace, "04", Claim("sb", 0, lease(namespace, "sb", "alice")))
        stored = kubectl.json("-n", namespace, "get", api.LEDGER_PLURAL, "sandfleet-ledger-04")
        assert stored["spec"]["entries"] == "not gzip, not base64"
    finally:
        await book.stop()


async def test_a_deleted_pods_entry_stays_held_for_a_writer_whose_pod_watch_lags(
    kube: KubeClient, namespace: str
) -> None:
    """The writer that saw the Pods go retires their entries; one whose Pod watch still shows them
    cannot lease them (as free without an entry, or on the entry it knew) until the tombstone ends."""
    now = [time.time()]
    seer, lagging = await started(kube, namespace, lambda: now[0]), await started(kube, namespace)
    try:
        released = await seer.submit(namespace, "05", Claim("done", 0, lease(namespace, "done", "alice")))
        claimed = await seer.submit(namespace, "05", Claim("free", 0, lease(namespace, "free", "alice")))
        assert released is not None
        assert claimed is not None
        assert await seer.submit(namespace, "05", Release("done", f"{namespace}.done")) is not None
        free = await seer.submit(namespace, "05", Unclaim("free", claimed.rev))  # free again, rev 2
        assert free is not None
        assert free.state == api.LEASE_FREE
        seer.pod_gone(namespace, "05", "done")
        seer.pod_gone(namespace, "05", "free")
        # The next write on the shard, whatever it is for, carries the retirement.
        other = await seer.submit(namespace, "05", Claim("other", 0, lease(namespace, "other", "bob")))
        assert other is not None
        stored = await lagging.read(namespace, "05")
        assert stored is not None
        assert is_tombstone(stored.entries["done"])  # retired, its lease no longer stored
        assert is_tombstone(stored.entries["free"])
        for claim in (
            Claim("done", 0, lease(namespace, "done", "mallory")),  # as if it had no entry
            Claim("free", 0, lease(namespace, "free", "mallory")),
            Claim("free", free.rev, lease(namespace, "free", "mallory")),  # on the entry it knew
        ):
            assert await lagging.submit(namespace, "05", claim) is None, claim
        now[0] += TOMBSTONE_SECONDS
        assert await seer.submit(namespace, "05", Release("other", f"{namespace}.other")) is not None
        stored = await lagging.read(namespace, "05")
        assert stored is not None
        assert set(stored.entries) == {"other"}
    finally:
        await seer.stop()
        await lagging.stop()
