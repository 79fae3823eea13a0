"""Lease ledgers over the API: a watch that keeps every shard's SandboxLedger, and group-committed writes.

Operations on a shard (`submit`) queue up while the shard's previous write is in flight; the next
write takes all of them, decides each against the ledger as last read (`core.ledger.decide`) and
commits the lot as one merge patch conditional on the ledger's resourceVersion. A 409 means another
writer (a second gateway replica, the operator) was first: the ledger is read again and the same
operations decided afresh, so one that the other writer made impossible is refused, never lost in
a double lease. An operation's caller hears its outcome only once the write holding it committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from tenacity import AsyncRetrying, RetryError, TryAgain, retry_never, stop_after_attempt

from sandfleet.core import api
from sandfleet.core.ledger import (
    UNREADABLE,
    Ledger,
    LedgerEntry,
    Op,
    apply_changes,
    decide,
    ledger_name,
    ledger_object,
    ledger_patch,
    read_entries,
    stored_entries,
)
from sandfleet.kube.api_calls import MERGE_PATCH, METADATA_LIST, KubeClient
from sandfleet.kube.errors import KubeError
from sandfleet.kube.informer import Informer
from sandfleet.kube.keyed_feed import KeyedFeed
from sandfleet.kube.metrics import LEDGER_BATCH, LEDGER_WRITES

log = logging.getLogger(__name__)

# Conflicts in a row before a batch gives up (its callers get an error to retry): each is a write by
# somebody else, so this many means the shard is contended far beyond anything the design expects.
MAX_ATTEMPTS = 16
# How long a keyed refresh waits for the watch to bring a ledger it knows is newer, before a GET.
CATCH_UP_SECONDS = 0.5

ShardKey = tuple[str, str]  # (namespace, shard)
# (namespace, shard, the Pods whose entry changed, None for every Pod of the shard): how a
# ledger's readers hear of each change.
ChangeListener = Callable[[str, str, set[str] | None], None]


class LedgerUnavailable(RuntimeError):
    """A ledger write could not be made (the apiserver is away, or the shard too contended): retry."""


@dataclass(frozen=True)
class _Written:
    blob: str
    entries: dict[str, LedgerEntry]
    raw: dict[str, str]
    changed: frozenset[str]


@dataclass
class _Shard:
    ledger: Ledger | None = None
    raw: dict[str, str] = field(default_factory=dict)  # pod -> its entry's JSON, as last read
    pending: list[tuple[Op, asyncio.Future[LedgerEntry | None]]] = field(default_factory=list)
    flusher: asyncio.Task[None] | None = None
    # Pods seen deleted (and when) whose entries are still held: retired, dropped once old enough.
    gone: dict[str, float] = field(default_factory=dict)
    # Its stored entries could not be read (damage, or a writer of another encoding): every Pod of
    # the shard reads as held, and nothing is written over it.
    unreadable: bool = False
    # The write in flight: its stored entries string, and what it holds. The watch often shows
    # the write before its answer arrives; recognised, it is kept without decoding it again.
    writing: _Written | None = None


@dataclass
class _Watch:
    namespace: str | None  # None: every namespace
    synced: bool = False


def _version(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return -1


class LedgerBook:
    """The ledgers of some namespaces (or of all), read by watches and written in batches."""

    def __init__(
        self,
        kube: KubeClient,
        namespaces: Sequence[str],
        on_change: ChangeListener,
        clock: Callable[[], float] = time.time,
        linger_seconds: float = 0.0,
    ) -> None:
        self.kube = kube
        self.namespaces = tuple(namespaces)  # empty: every namespace (one cluster-wide watch)
        self.on_change = on_change
        self.clock = clock
        # How long a write waits for more operations once it could start (0: only this loop turn's).
        self.linger_seconds = linger_seconds
        self.synced = asyncio.Event()
        self._shards: dict[ShardKey, _Shard] = {}
        self._watches: list[_Watch] = []
        self._informers: list[Informer] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.writes = 0  # committed writes, for tests and benchmarks (the metric has every result)

    # -- reading ---------------------------------------------------------------------------------

    def ledger(self, namespace: str, shard: str) -> Ledger | None:
        known = self._shards.get((namespace, shard))
        return known.ledger if known is not None else None

    def entry(self, namespace: str, shard: str, pod: str) -> LedgerEntry | None:
        known = self._shards.get((namespace, shard))
        if known is None or known.ledger is None:
            return None
        return UNREADABLE if known.unreadable else known.ledger.entries.get(pod)

    def ledgers(self) -> list[Ledger]:
        return [s.ledger for s in self._shards.values() if s.ledger is not None]

    @property
    def connected(self) -> bool:
        return bool(self._informers) and all(informer.connected for informer in self._informers)

    async def start(self) -> None:
        """Start the watches (returns at once; `synced` is set once every first list is in)."""
        watched: list[str | None] = [*self.namespaces] or [None]
        self._watches = [_Watch(namespace) for namespace in watched]
        for watch in self._watches:
            feed = KeyedFeed(
                _watched_ledger,
                _ledger_key,
                self._watched,
                self._drop,
                functools.partial(self._held, watch.namespace),
                functools.partial(self._listed, watch),
            )
            informer = Informer(
                self.kube,
                self._collection(watch.namespace),
                feed.on_event,
                feed.on_synced,
                resource=api.LEDGER_PLURAL,
            )
            self._informers.append(informer)
            self._tasks.append(asyncio.create_task(informer.run()))

    async def stop(self) -> None:
        tasks = [t for t in (*self._tasks, *(s.flusher for s in self._shards.values())) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def pod_gone(self, namespace: str, shard: str, pod: str) -> None:
        """A Pod was deleted: the writes on its shard retire its entry, then drop it (core.ledger.decide)."""
        known = self._shards.get((namespace, shard))
        if known is not None and known.ledger is not None and pod in known.ledger.entries:
            known.gone.setdefault(pod, self.clock())

    async def read(self, namespace: str, shard: str) -> Ledger | None:
        """Read one ledger from the apiserver (a consistent read) and keep it if it is newer."""
        try:
            obj = await self.kube.json("GET", self._item(namespace, shard))
        except KubeError as error:
            if error.status != 404:
                raise
            return self.ledger(namespace, shard)
        self._store(obj)
        return self.ledger(namespace, shard)

    async def refresh(self, namespace: str) -> None:
        """Bring every ledger of `namespace` up to what the apiserver holds now.

        One consistent list of the ledgers' metadata says which have changed since our watch last
        showed them; those the watch does not bring within a moment are read. Afterwards every
        write that committed before this call, by any writer, is in what `entry` answers.
        """
        listed = await self.kube.json("GET", self._collection(namespace), accept=METADATA_LIST)
        behind: list[tuple[str, int]] = []
        for item in listed.get("items") or ():
            meta = item.get("metadata") or {}
            shard = _shard_of(str(meta.get("name", "")))
            if shard is None:
                continue
            known = self.ledger(namespace, shard)
            want = _version(str(meta.get("resourceVersion", "")))
            if known is None or _version(known.resource_version) < want:
                behind.append((shard, want))
        if not behind:
            return
        deadline = time.monotonic() + CATCH_UP_SECONDS
        for shard, want in behind:
            while time.monotonic() < deadline:
                known = self.ledger(namespace, shard)
                if known is not None and _version(known.resource_version) >= want:
                    break
                await asyncio.sleep(0.01)
            else:
                await self.read(namespace, shard)

    # -- writing ---------------------------------------------------------------------------------

    async def submit(self, namespace: str, shard: str, op: Op) -> LedgerEntry | None:
        """Queue `op` on the shard; its outcome once the write that holds it commits.

        The entry it left, or None when it was refused (the entry was not what it was decided on);
        LedgerUnavailable when the write failed (nothing is known to have changed: retry).
        """
        key = (namespace, shard)
        known = self._shards.setdefault(key, _Shard())
        future: asyncio.Future[LedgerEntry | None] = asyncio.get_running_loop().create_future()
        known.pending.append((op, future))
        if known.flusher is None:
            known.flusher = asyncio.create_task(self._flush(key, known))
        # Not shielded: a caller that goes away cancels only its own future, and the commit, which
        # settles only futures not done, goes on for the rest of the batch (a shield costs each of
        # a batch's operations a second future and two callbacks).
        return await future

    async def _flush(self, key: ShardKey, shard: _Shard) -> None:
        try:
            while shard.pending:
                # Let every operation of this turn of the loop (a whole dispatch) join the batch.
                await asyncio.sleep(self.linger_seconds)
                batch, shard.pending = shard.pending, []
                await self._commit(key, shard, batch)
        finally:
            shard.flusher = None
            if shard.pending:  # arrived while the task was ending
                shard.flusher = asyncio.create_task(self._flush(key, shard))

    async def _commit(
        self, key: ShardKey, shard: _Shard, batch: list[tuple[Op, asyncio.Future[LedgerEntry | None]]]
    ) -> None:
        namespace, name = key
        ops = [op for op, _ in batch]
        LEDGER_BATCH.observe(len(ops))
        # Decided and written again after a conflict (TryAgain), at once; any other failure ends it.
        retrying = AsyncRetrying(retry=retry_never, stop=stop_after_attempt(MAX_ATTEMPTS))
        try:
            await retrying(self._write_once, key, shard, batch)
            return
        except RetryError:
            reason = f"{MAX_ATTEMPTS} conflicts in a row"
        except (LedgerUnavailable, KubeError, TimeoutError, OSError, aiohttp.ClientError) as error:
            reason = f"{type(error).__name__}: {error}"
        LEDGER_WRITES.labels("failed").inc()
        log.warning("ledger %s/%s: a write of %d operations failed (%s)", namespace, name, len(ops), reason)
        unavailable = LedgerUnavailable(f"the lease ledger could not be written ({reason}); retry shortly")
        for _, future in batch:
            if not future.done():
                future.set_exception(unavailable)

    async def _write_once(
        self, key: ShardKey, shard: _Shard, batch: list[tuple[Op, asyncio.Future[LedgerEntry | None]]]
    ) -> None:
        """Decide the batch against the ledger as last read and write it; TryAgain after a conflict."""
        namespace, name = key
        ledger = shard.ledger
        if shard.unreadable:
            raise LedgerUnavailable(f"ledger {ledger_name(name)} in {namespace} cannot be read")
        before = ledger.entries if ledger is not None else {}
        gone = {pod: at for pod, at in shard.gone.items() if pod in before}
        decision = decide(before, [op for op, _ in batch], self.clock(), gone)
        if not decision.changes:
            _settle(batch, decision.results)
            return
        entries, raw = apply_changes(before, shard.raw, decision.changes)
        if ledger is None:
            body = ledger_object(namespace, name, entries, raw)
        else:
            body = ledger_patch(ledger.resource_version, name, entries, raw)
        shard.writing = _Written(body["spec"]["entries"], entries, raw, frozenset(decision.changes))
        try:
            if ledger is None:
                obj = await self.kube.json("POST", self._collection(namespace), body=body)
            else:
                obj = await self.kube.json(
                    "PATCH", self._item(namespace, name), body=body, content_type=MERGE_PATCH
                )
        except KubeError as failed:
            shard.writing = None
            if failed.status == 409:  # somebody wrote (or created) it first
                LEDGER_WRITES.labels("conflict").inc()
                await self.read(namespace, name)  # a failed read ends the commit
                raise TryAgain from None
            if failed.status == 404 and ledger is not None:  # deleted under us: create afresh
                shard.ledger, shard.raw = None, {}
                raise TryAgain from None
            raise
        except (TimeoutError, OSError, aiohttp.ClientError):
            shard.writing = None
            raise
        shard.writing = None
        LEDGER_WRITES.labels("committed").inc()
        self.writes += 1
        for pod, change in decision.changes.items():
            if change is None:
                shard.gone.pop(pod, None)
        # What it holds now is what we wrote (the write was conditional on what we read): no
        # need to decode it again from the answer.
        version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        self._keep(key, Ledger(namespace, name, version, entries), raw, set(decision.changes))
        _settle(batch, decision.results)

    # -- the watch -------------------------------------------------------------------------------

    def _watched(self, key: ShardKey, obj: dict[str, Any]) -> None:
        self._store(obj)

    def _held(self, namespace: str | None) -> Iterator[ShardKey]:
        """The ledgers held of `namespace` (None: of all), however they were learned: what a relist drops."""
        for key, known in self._shards.items():
            if known.ledger is not None and (namespace is None or key[0] == namespace):
                yield key

    def _listed(self, watch: _Watch) -> None:
        """A (re)list of `watch` ended (what it did not show was dropped)."""
        watch.synced = True
        if all(w.synced for w in self._watches):
            self.synced.set()

    def _drop(self, key: ShardKey) -> None:
        known = self._shards.get(key)
        if known is None or known.ledger is None:
            return
        changed = set(known.ledger.entries)
        known.ledger, known.raw = None, {}
        self.on_change(key[0], key[1], changed)

    def _store(self, obj: dict[str, Any]) -> None:
        """Keep a ledger read from the apiserver unless what we hold is newer; tell who changed."""
        meta = obj.get("metadata") or {}
        namespace = str(meta.get("namespace", ""))
        shard = str((obj.get("spec") or {}).get("shard", "")) or _shard_of(str(meta.get("name", ""))) or ""
        key = (namespace, shard)
        known = self._shards.setdefault(key, _Shard())
        version = str(meta.get("resourceVersion", ""))
        if known.ledger is not None and _version(known.ledger.resource_version) >= _version(version):
            return
        written = known.writing
        if written is not None and (obj.get("spec") or {}).get("entries") == written.blob:
            ledger = Ledger(namespace, shard, version, written.entries)
            self._keep(key, ledger, written.raw, set(written.changed))
            return
        before = known.ledger.entries if known.ledger is not None else {}
        raw = stored_entries(obj)
        if raw is None:
            log.error(
                "ledger %s in %s cannot be read: its Pods count as held until it can",
                meta.get("name"),
                namespace,
            )
            known.ledger, known.raw, known.unreadable = Ledger(namespace, shard, version, before), {}, True
            self.on_change(namespace, shard, None)
            return
        entries, changed = read_entries(raw, known.raw, before)
        self._keep(key, Ledger(namespace, shard, version, entries), raw, changed)

    def _keep(self, key: ShardKey, ledger: Ledger, raw: dict[str, str], changed: set[str]) -> None:
        """Hold `ledger` (its entries' JSON `raw`) as the shard's latest; tell who changed."""
        known = self._shards.setdefault(key, _Shard())
        if known.ledger is not None and _version(known.ledger.resource_version) >= _version(
            ledger.resource_version
        ):
            return
        known.ledger, known.raw, known.unreadable = ledger, raw, False
        known.gone = {pod: at for pod, at in known.gone.items() if pod in ledger.entries}
        if changed:
            self.on_change(key[0], key[1], changed)

    def _collection(self, namespace: str | None) -> str:
        base = f"/apis/{api.GROUP}/{api.VERSION}"
        if namespace is None:
            return f"{base}/{api.LEDGER_PLURAL}"
        return f"{base}/namespaces/{namespace}/{api.LEDGER_PLURAL}"

    def _item(self, namespace: str, shard: str) -> str:
        return f"{self._collection(namespace)}/{ledger_name(shard)}"


def _watched_ledger(obj: dict[str, Any]) -> dict[str, Any] | None:
    """A watched object, if it is a shard's ledger (by its name)."""
    return obj if _shard_of(str((obj.get("metadata") or {}).get("name", ""))) else None


def _ledger_key(obj: dict[str, Any]) -> ShardKey:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), _shard_of(str(meta.get("name", ""))) or ""


def _shard_of(name: str) -> str | None:
    if not name.startswith(api.LEDGER_NAME_PREFIX):
        return None
    shard = name[len(api.LEDGER_NAME_PREFIX) :]
    return shard if shard.isdigit() else None


def _settle(
    batch: list[tuple[Op, asyncio.Future[LedgerEntry | None]]], results: tuple[LedgerEntry | None, ...]
) -> None:
    for (_, future), result in zip(batch, results, strict=True):
        if not future.done():
            future.set_result(result)
