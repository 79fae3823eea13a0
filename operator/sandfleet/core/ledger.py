"""The lease ledger: a shard's leases in one object, changed by conditional batches of operations.

A pool whose leases live in the ledger (`spec.lease.store: ledger`) never writes a lease on its
Pods. The operator labels each Pod it creates with one of a few shards; each shard of a namespace
has one SandboxLedger object whose `spec.entries` map a Pod's name to its lease entry. Whoever
changes leases (any gateway replica, and the operator before it deletes a Pod that may be leased)
collects the operations due on a shard for a moment and writes them as one merge patch with the
ledger's resourceVersion as precondition. So:

- a batch of N claims costs one write per shard it touches, not N;
- two writers can never both win: the one whose resourceVersion is stale gets a 409, reads the
  ledger again, and decides its operations afresh against what the other wrote (`decide`);
- every operation names the entry revision it was decided on, so a claim decided on a free Pod
  cannot land on one somebody leased meanwhile, and an un-claim cannot undo a retry's adoption.

This module is the pure part: entries, their JSON, the operations and what they decide. The
writes themselves are `sandfleet.kube.ledger`'s.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from sandfleet.core import api
from sandfleet.core.leases import LeaseRecord, lease_from_json
from sandfleet.core.model import SandboxPod

# A namespace's ledgers: 24 divide among 1, 2, 3, 4, 6 or 8 gateway replicas evenly
# (core.partition.shard_owner).
DEFAULT_SHARDS: Final = 24
MAX_SHARDS: Final = 100  # a shard's label is two digits (shard_for)
# A pool spreads its Pods over one shard per this many of them (at most all the shards): a small
# pool's batch is one ledger write, a large pool's Pods are spread for the replicas to share.
PODS_PER_SHARD: Final = 128
# Entries a ledger may hold: etcd refuses objects over 1.5 MiB, and an entry takes ~0.1 KB of the
# compressed blob (encode_entries), so a claim that would add one more is refused (the lease
# service tries another shard's sandbox).
MAX_ENTRIES: Final = 5_000
# How long a deleted Pod's entry is kept (as held) after a writer saw the Pod go. Every writer
# reads Pods and ledgers through two watches that may lag each other: a Pod without an entry
# reads as free, so had the entry gone at once, a writer whose Pod watch has not shown the
# deletion yet would lease a Pod that no longer exists.
TOMBSTONE_SECONDS: Final = 60.0


@dataclass(frozen=True)
class LedgerEntry:
    """One Pod's lease state in its shard's ledger; `rev` counts the entry's changes."""

    state: str
    rev: int
    episodes: int = 0
    lease: LeaseRecord | None = None
    reserved_for: tuple[str, str] | None = None  # (holder, run) a reset sandbox waits for
    reserved_since: float | None = None
    changed_at: float = 0.0


# What a Pod without an entry reads as: free, never changed.
FREE: Final = LedgerEntry(state=api.LEASE_FREE, rev=0)


@dataclass(frozen=True)
class Ledger:
    """One shard's ledger as read from the apiserver."""

    namespace: str
    shard: str
    resource_version: str
    entries: Mapping[str, LedgerEntry] = field(default_factory=dict)

    def entry(self, pod: str) -> LedgerEntry:
        return self.entries.get(pod, FREE)


def ledger_name(shard: str) -> str:
    """The SandboxLedger object that holds a shard's leases."""
    return f"{api.LEDGER_NAME_PREFIX}{shard}"


def shard_for(pod_name: str, pool: str = "", pool_size: int = 0, shards: int = DEFAULT_SHARDS) -> str:
    """The shard a new Pod of `pool` goes to: two digits (labels sort as numbers).

    A pool of `pool_size` sandboxes uses `pool_shards` consecutive shards from a start its name
    picks, so pools of one namespace spread over different ledgers; the Pod's name picks one of
    them. Consecutive shards go to different replicas (core.partition.shard_owner).
    """
    shards = max(1, shards)
    start = _hash(f"pool\0{pool}") % shards
    return f"{(start + _hash(pod_name) % pool_shards(pool_size, shards)) % shards:02d}"


def pool_shards(pool_size: int, shards: int = DEFAULT_SHARDS) -> int:
    """How many shards a pool of `pool_size` sandboxes spreads over: 1 per PODS_PER_SHARD, all at most."""
    return max(1, min(shards, -(-pool_size // PODS_PER_SHARD)))


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


# -- entries as JSON (one string per Pod: the schema stays trivial and a diff compares strings) ----


def entry_to_json(entry: LedgerEntry) -> str:
    data: dict[str, Any] = {"state": entry.state, "rev": entry.rev, "at": entry.changed_at}
    if entry.episodes:
        data["episodes"] = entry.episodes
    if entry.lease is not None:
        # Its fields as they are (asdict would deep-copy each, a third of a batch's CPU).
        data["lease"] = dict(vars(entry.lease))
    if entry.reserved_for is not None:
        holder, run = entry.reserved_for
        data["reserved"] = {"holder": holder, "run": run, "since": entry.reserved_since}
    return _ENTRY_ENCODER.encode(data)


# One encoder for every entry: json.dumps with options builds a new one per call.
_ENTRY_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def entry_from_json(raw: object) -> LedgerEntry | None:
    """An entry read back, None when unreadable (a writer of another version, or damage)."""
    if not isinstance(raw, str):
        return None
    try:
        data = json.loads(raw)
        reserved = data.get("reserved") or {}
        since = reserved.get("since")
        return LedgerEntry(
            state=str(data["state"]),
            rev=int(data["rev"]),
            episodes=int(data.get("episodes", 0)),
            lease=lease_from_json(data["lease"]) if data.get("lease") is not None else None,
            reserved_for=(str(reserved["holder"]), str(reserved["run"])) if reserved else None,
            reserved_since=float(since) if since is not None else None,
            changed_at=float(data.get("at", 0.0)),
        )
    except (TypeError, ValueError, KeyError, AttributeError):
        return None


# What an entry nobody can read counts as: held (never free, never reaped), so a Pod whose lease
# cannot be read is never handed out.
UNREADABLE: Final = LedgerEntry(state="unreadable", rev=-1)
# How a ledger's entries are stored in its object (spec.encoding), for readers of other versions.
ENCODING: Final = "gzip+base64/tsv"


def encode_entries(raw: Mapping[str, str]) -> str:
    """A ledger's entries (pod -> entry JSON) as stored: `pod<TAB>json` lines, sorted, gzip, base64.

    One compressed string instead of a map: the apiserver's cost of a write grows with the bytes
    of the whole object (every write stores all of it), and lease entries compress about 8:1. It is
    how Helm stores a release. Read one with `kubectl get sandboxledger NAME -o
    jsonpath='{.spec.entries}' | base64 -d | gunzip`, or `sandfleet leases --all`.
    """
    lines = "".join(f"{pod}\t{raw[pod]}\n" for pod in sorted(raw))
    # The fastest level: the bytes a write costs are already an eighth, and a writer's CPU counts too.
    return base64.b64encode(gzip.compress(lines.encode(), compresslevel=1, mtime=0)).decode()


def decode_entries(blob: object) -> dict[str, str] | None:
    """The entries' JSON by pod from a stored blob; None when it cannot be read at all."""
    if not isinstance(blob, str):
        return None
    if not blob:
        return {}
    try:
        lines = gzip.decompress(base64.b64decode(blob, validate=True)).decode()
    except (ValueError, OSError, EOFError):
        return None
    raw: dict[str, str] = {}
    for line in lines.splitlines():
        pod, tab, entry = line.partition("\t")
        if tab:
            raw[pod] = entry
    return raw


def read_entries(
    raw: Mapping[str, str],
    known_raw: Mapping[str, str] | None = None,
    known: Mapping[str, LedgerEntry] | None = None,
) -> tuple[dict[str, LedgerEntry], set[str]]:
    """A ledger's entries from their JSON, and the Pods whose entry changed since `known`.

    An entry whose JSON is the same as in `known_raw` is taken from `known` unparsed: a ledger holds
    thousands of entries and a write changes a few.
    """
    known_raw, known = known_raw or {}, known or {}
    entries: dict[str, LedgerEntry] = {}
    changed: set[str] = set()
    for pod, value in raw.items():
        if pod in known and known_raw.get(pod) == value:
            entries[pod] = known[pod]
            continue
        entries[pod] = entry_from_json(value) or UNREADABLE
        changed.add(pod)
    changed |= set(known) - set(raw)
    return entries, changed


def stored_entries(obj: Mapping[str, Any]) -> dict[str, str] | None:
    """The entries' JSON by pod of a SandboxLedger object; None when its entries cannot be read."""
    spec = obj.get("spec") or {}
    if spec.get("encoding", ENCODING) != ENCODING:
        return None
    return decode_entries(spec.get("entries", ""))


def ledger_from_object(obj: Mapping[str, Any]) -> Ledger:
    """A Ledger from a SandboxLedger object.

    One whose entries cannot be read at all holds none a writer could trust: such a ledger is
    refused by the writers (kube.ledger), and reads here as empty.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    entries, _ = read_entries(stored_entries(obj) or {})
    return Ledger(
        namespace=str(meta.get("namespace", "")),
        shard=str(spec.get("shard", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        entries=entries,
    )


def ledger_spec(
    shard: str, entries: Mapping[str, LedgerEntry], raw: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A ledger's spec holding `entries`, with counts for `kubectl get sandboxledgers`.

    `raw` is their JSON when the caller has it already (`entry_to_json` of each).
    """
    if raw is None:
        raw = {pod: entry_to_json(entry) for pod, entry in entries.items()}
    return {
        "shard": shard,
        "encoding": ENCODING,
        "entries": encode_entries(raw),
        "count": len(raw),
        "leased": sum(entry.state == api.LEASE_LEASED for entry in entries.values()),
    }


def ledger_object(
    namespace: str, shard: str, entries: Mapping[str, LedgerEntry], raw: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A new SandboxLedger (the body of its create)."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.LEDGER_KIND,
        "metadata": {
            "name": ledger_name(shard),
            "namespace": namespace,
            "labels": {api.MANAGED_BY_LABEL: api.MANAGED_BY},
        },
        "spec": ledger_spec(shard, entries, raw),
    }


def ledger_patch(
    resource_version: str,
    shard: str,
    entries: Mapping[str, LedgerEntry],
    raw: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The merge patch that makes a ledger hold `entries`, only if it is still at `resource_version`."""
    return {"metadata": {"resourceVersion": resource_version}, "spec": ledger_spec(shard, entries, raw)}


def apply_changes(
    entries: Mapping[str, LedgerEntry], raw: Mapping[str, str], changes: Mapping[str, LedgerEntry | None]
) -> tuple[dict[str, LedgerEntry], dict[str, str]]:
    """`entries` and their JSON `raw` with `changes` made (None removes an entry)."""
    after, after_raw = dict(entries), dict(raw)
    for pod, entry in changes.items():
        if entry is None:
            after.pop(pod, None)
            after_raw.pop(pod, None)
        else:
            after[pod] = entry
            after_raw[pod] = entry_to_json(entry)
    return after, after_raw


# -- operations ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """Lease a free Pod (or one reserved for the lease's holder and run), decided on entry `rev`."""

    pod: str
    rev: int
    lease: LeaseRecord


@dataclass(frozen=True)
class Rewrite:
    """Replace a live lease's record (a renewal, or a retry adopting it), decided on entry `rev`."""

    pod: str
    rev: int
    lease: LeaseRecord


@dataclass(frozen=True)
class Unclaim:
    """Take back a claim nobody received (decided on the claim's `rev`): free, or back to its run."""

    pod: str
    rev: int


@dataclass(frozen=True)
class Release:
    """End lease `lease_id` (whatever renewed it since): the operator then deletes the Pod."""

    pod: str
    lease_id: str


@dataclass(frozen=True)
class Reserve:
    """End lease `lease_id` on a Pod its agent has reset: kept for the run's next lease."""

    pod: str
    lease_id: str
    holder: str
    run: str
    episodes: int


@dataclass(frozen=True)
class Retire:
    """The operator will delete the Pod: nobody may lease it from now on (decided on entry `rev`)."""

    pod: str
    rev: int


Op = Claim | Rewrite | Unclaim | Release | Reserve | Retire


@dataclass(frozen=True)
class Decision:
    """What a batch of operations changes, and each operation's outcome."""

    changes: dict[str, LedgerEntry | None]  # pod -> its new entry (None: the entry goes)
    results: tuple[LedgerEntry | None, ...]  # per operation: the entry it leaves, None if refused


def decide(
    entries: Mapping[str, LedgerEntry],
    ops: Sequence[Op],
    now: float,
    gone: Mapping[str, float] | None = None,
    max_entries: int = MAX_ENTRIES,
) -> Decision:
    """Apply `ops` in order to `entries` (each sees the ones before it); retire, then drop, gone Pods'.

    `gone` maps a deleted Pod to when the writer saw it go: its entry is made a `tombstone` at once
    (retired: nobody may lease it, whatever their watches still show) and dropped
    `TOMBSTONE_SECONDS` later.

    An operation that finds its entry other than it was decided on is refused (its result is None)
    and changes nothing; one that finds its own effect already there (its earlier write committed
    though its answer was lost) succeeds without a change.
    """
    current: dict[str, LedgerEntry] = dict(entries)
    changes: dict[str, LedgerEntry | None] = {}
    for pod, seen_at in (gone or {}).items():
        entry = current.get(pod)
        if entry is None:
            continue
        if now - seen_at >= TOMBSTONE_SECONDS:
            del current[pod]
            changes[pod] = None
        elif not is_tombstone(entry):
            current[pod] = changes[pod] = tombstone(entry, now)
    results: list[LedgerEntry | None] = []
    for op in ops:
        before = current.get(op.pod, FREE)
        after = _apply(op, before, now, full=len(current) >= max_entries and op.pod not in current)
        results.append(after)
        if after is not None and after != before:
            current[op.pod] = after
            changes[op.pod] = after
    return Decision(changes, tuple(results))


def tombstone(entry: LedgerEntry, now: float) -> LedgerEntry:
    """A gone Pod's entry until it is dropped: retired, no more (every write encodes every entry)."""
    return LedgerEntry(api.LEASE_RETIRED, entry.rev + 1, entry.episodes, changed_at=now)


def is_tombstone(entry: LedgerEntry) -> bool:
    return entry.state == api.LEASE_RETIRED and entry.lease is None and entry.reserved_for is None


def _apply(op: Op, entry: LedgerEntry, now: float, full: bool) -> LedgerEntry | None:
    """The entry `op` leaves behind, `entry` itself when it is already done, None when refused."""
    if isinstance(op, Claim):
        if entry.state == api.LEASE_LEASED and entry.lease == op.lease:
            return entry
        run = (op.lease.holder, op.lease.run or "")
        claimable = entry.state == api.LEASE_FREE or (
            entry.state == api.LEASE_RESERVED and entry.reserved_for == run
        )
        if entry.rev != op.rev or not claimable or full:
            return None
        return LedgerEntry(api.LEASE_LEASED, entry.rev + 1, entry.episodes, op.lease, changed_at=now)
    if isinstance(op, Rewrite):
        if entry.state == api.LEASE_LEASED and entry.lease == op.lease:
            return entry
        if entry.rev != op.rev or entry.state != api.LEASE_LEASED or entry.lease is None:
            return None
        if entry.lease.id != op.lease.id:
            return None
        return replace(entry, rev=entry.rev + 1, lease=op.lease, changed_at=now)
    if isinstance(op, Unclaim):
        if entry.rev != op.rev or entry.state != api.LEASE_LEASED or entry.lease is None:
            return None
        lease = entry.lease
        if entry.episodes and lease.run:
            # A recycled sandbox nobody received goes back to its run, never to warm for anyone.
            return LedgerEntry(
                api.LEASE_RESERVED, entry.rev + 1, entry.episodes, None, (lease.holder, lease.run), now, now
            )
        return LedgerEntry(api.LEASE_FREE, entry.rev + 1, entry.episodes, changed_at=now)
    if isinstance(op, Release):
        if entry.lease is None or entry.lease.id != op.lease_id or entry.state != api.LEASE_LEASED:
            return None
        return replace(entry, state=api.LEASE_RELEASED, rev=entry.rev + 1, changed_at=now)
    if isinstance(op, Reserve):
        if entry.state == api.LEASE_RESERVED and entry.episodes == op.episodes:
            return entry if entry.reserved_for == (op.holder, op.run) else None
        # Only from leased: a released entry is the operator's to delete, never to bring back.
        if entry.lease is None or entry.lease.id != op.lease_id or entry.state != api.LEASE_LEASED:
            return None
        return LedgerEntry(
            api.LEASE_RESERVED, entry.rev + 1, op.episodes, None, (op.holder, op.run), now, now
        )
    # Retire
    if entry.state == api.LEASE_RETIRED:
        return entry
    if entry.rev != op.rev:
        return None
    return replace(entry, state=api.LEASE_RETIRED, rev=entry.rev + 1, changed_at=now)


# -- a Pod seen through its ledger ---------------------------------------------------------------------


def overlay(sandbox: SandboxPod, entry: LedgerEntry | None) -> SandboxPod:
    """A ledger Pod's reading with the lease state its ledger entry gives it (free without one)."""
    entry = entry or FREE
    return replace(
        sandbox,
        state=entry.state,
        lease=entry.lease,
        expiry_annotation=None,
        episodes=entry.episodes,
        reserved_for=entry.reserved_for,
        reserved_since=entry.reserved_since,
        entry_rev=entry.rev,
    )


def changed_pods(before: Mapping[str, LedgerEntry], after: Mapping[str, LedgerEntry]) -> set[str]:
    """The Pods whose entry differs between two readings of a ledger (added, changed or gone)."""
    return {pod for pod in before.keys() | after.keys() if before.get(pod) != after.get(pod)}
