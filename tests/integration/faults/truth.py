"""The cluster's record of every sandbox Pod's life, from watches the harness owns (never the gateway's).

It notes each Pod's node, every distinct lease it carried (its annotation, or its entry in its
shard's SandboxLedger), a claim taken back (its entry free again with no release), and when it
was released, marked for deletion and gone; relists (after an apiserver restart) are noted as gaps.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, replace
from typing import Any

from sandfleet.core import api
from sandfleet.core.leases import episodes_from_annotations, reservation_from_annotations
from sandfleet.core.ledger import LedgerEntry, entry_from_json, stored_entries
from sandfleet.core.model import lease_episode
from tests.integration.faults.kubeapi import KubeApi
from tests.support.invariants import ObservedLease, PodTruth, Reservation


class PodRecorder:
    """Follows the namespace's sandbox Pods in a thread and keeps a PodTruth per Pod uid."""

    def __init__(self, kube: KubeApi, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.pods: dict[str, PodTruth] = {}
        self.gaps: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listing: set[str] | None = None
        self._last_event = time.time()
        self._thread = threading.Thread(target=self._run, name="pod-recorder", daemon=True)
        self._ledger_thread = threading.Thread(
            target=self._follow_ledgers, name="ledger-recorder", daemon=True
        )
        self._uid_by_name: dict[str, str] = {}
        # Ledger entries seen for Pods the Pod watch has not shown yet: noted once it does.
        self._early: dict[str, list[LedgerEntry]] = {}
        self._ledger_raw: dict[str, dict[str, str]] = {}  # ledger name -> its entries' JSON, as last seen

    def start(self) -> None:
        self._thread.start()
        self._ledger_thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
        self._ledger_thread.join(timeout=15)

    def snapshot(self, since: float = 0.0) -> list[PodTruth]:
        """Pods alive at or after `since` (copies, so checks never race the recorder)."""
        with self._lock:
            return [
                PodTruth(
                    p.name,
                    p.uid,
                    p.node,
                    p.first_seen,
                    list(p.leases),
                    p.released_at,
                    p.deleting_at,
                    p.deleted_at,
                    list(p.reservations),
                )
                for p in self.pods.values()
                if p.deleted_at is None or p.deleted_at >= since
            ]

    def gaps_since(self, since: float) -> list[tuple[float, float]]:
        with self._lock:
            return [gap for gap in self.gaps if gap[1] >= since]

    def _run(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        self.kube.watch(path, self._on_event, self._stop, selector=api.POOL_LABEL)

    def _on_event(self, kind: str, pod: dict[str, Any]) -> None:
        now = time.time()
        with self._lock:
            if kind == "SYNC":
                if self.pods:
                    self.gaps.append((self._last_event, now))
                self._listing = set()
                return
            if kind == "LISTED":
                # Pods the relist did not show went while nobody watched.
                for uid, known in self.pods.items():
                    if uid not in (self._listing or set()) and known.deleted_at is None:
                        known.deleted_at = now
                self._listing = None
                return
            self._last_event = now
            metadata = pod.get("metadata") or {}
            uid = str(metadata.get("uid", ""))
            if self._listing is not None:
                self._listing.add(uid)
            truth = self.pods.get(uid)
            if truth is None:
                truth = PodTruth(str(metadata.get("name", "")), uid, first_seen=now)
                self.pods[uid] = truth
                self._uid_by_name[truth.name] = uid
                for entry in self._early.pop(truth.name, []):
                    self._note_entry(truth, entry, now)
            truth.node = (pod.get("spec") or {}).get("nodeName") or truth.node
            self._note_lease(truth, metadata)
            self._note_reservation(truth, metadata)
            labels = metadata.get("labels") or {}
            if labels.get(api.LEASE_STATE_LABEL) == api.LEASE_RELEASED and truth.released_at is None:
                truth.released_at = now
            if metadata.get("deletionTimestamp") and truth.deleting_at is None:
                truth.deleting_at = now
            if kind == "DELETED" and truth.deleted_at is None:
                truth.deleted_at = now

    def _follow_ledgers(self) -> None:
        path = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{self.namespace}/{api.LEDGER_PLURAL}"
        self.kube.watch(path, self._on_ledger, self._stop)

    def _on_ledger(self, kind: str, ledger: dict[str, Any]) -> None:
        """A ledger changed: note what each changed entry says of its Pod's lease."""
        if kind in ("SYNC", "LISTED", "DELETED"):
            return
        now = time.time()
        name = str((ledger.get("metadata") or {}).get("name", ""))
        raw = stored_entries(ledger) or {}
        with self._lock:
            before = self._ledger_raw.get(name, {})
            self._ledger_raw[name] = raw
            for pod, value in raw.items():
                if before.get(pod) == value:
                    continue
                entry = entry_from_json(value)
                if entry is None:
                    continue
                uid = self._uid_by_name.get(pod)
                if uid is None:
                    self._early.setdefault(pod, []).append(entry)
                    continue
                truth = self.pods[uid]
                self._note_entry(truth, entry, now)
                was = entry_from_json(before[pod]) if pod in before else None
                if was is not None and was.state == api.LEASE_LEASED and entry.state == api.LEASE_FREE:
                    self._note_withdrawal(truth, entry, now)

    @staticmethod
    def _note_entry(truth: PodTruth, entry: LedgerEntry, now: float) -> None:
        if entry.lease is not None and entry.state in (
            api.LEASE_LEASED,
            api.LEASE_RELEASED,
            api.LEASE_RETIRED,
        ):
            PodRecorder._note_record(truth, asdict(entry.lease))
        if entry.state == api.LEASE_RELEASED and truth.released_at is None:
            # When its writer decided the release (the apiserver's record of it), not when this
            # thread got to it: the ledger and Pod watches lag each other by milliseconds, and
            # the operator deletes a released Pod that fast.
            truth.released_at = min(entry.changed_at, now) if entry.changed_at else now
        if entry.state == api.LEASE_RESERVED and entry.reserved_for is not None:
            holder, run = entry.reserved_for
            kept = Reservation(entry.episodes, holder, run, entry.reserved_since or now)
            if kept not in truth.reservations:
                truth.reservations.append(kept)

    @staticmethod
    def _note_withdrawal(truth: PodTruth, entry: LedgerEntry, now: float) -> None:
        """Leased, then free with no release between: the claim was taken back (un-claimed)."""
        if not truth.leases or truth.leases[-1].withdrawn_at is not None:
            return
        at = min(entry.changed_at, now) if entry.changed_at else now
        truth.leases[-1] = replace(truth.leases[-1], withdrawn_at=at)

    @staticmethod
    def _note_reservation(truth: PodTruth, metadata: dict[str, Any]) -> None:
        annotations = metadata.get("annotations") or {}
        reservation = reservation_from_annotations(annotations)
        if reservation is None:
            return
        (holder, run), since = reservation
        kept = Reservation(episodes_from_annotations(annotations), holder, run, since)
        if kept not in truth.reservations:
            truth.reservations.append(kept)

    @staticmethod
    def _note_lease(truth: PodTruth, metadata: dict[str, Any]) -> None:
        raw = (metadata.get("annotations") or {}).get(api.LEASE_ANNOTATION)
        if not raw:
            return
        try:
            data = json.loads(raw)
        except ValueError:
            return
        PodRecorder._note_record(truth, data)

    @staticmethod
    def _note_record(truth: PodTruth, data: dict[str, Any]) -> None:
        holder = str(data.get("holder", ""))
        acquired = float(data.get("acquired_at", 0.0))
        key = str(data.get("idempotency_key") or f"{holder}/{acquired}")
        episode = lease_episode(str(data.get("id", ""))) or 0
        run = (data.get("labels") or {}).get("run")
        expires = float(data.get("expires_at", 0.0))
        observed = ObservedLease(key, holder, acquired, expires, episode, run)
        for index, known in enumerate(truth.leases):
            if known.key == observed.key and known.acquired_at == observed.acquired_at:
                truth.leases[index] = observed  # a renewal moves the expiry
                return
        truth.leases.append(observed)
