"""Invariants of a fleet under faults, checked on lease histories (pure functions over plain records).

Two witnesses are compared, never the gateway's own opinion: what each client did and was told
(`ClientLease`: every call with its time and answer) and what the cluster recorded on the Pods
(`PodTruth`: the lease annotations, release, deletion). `Loss` records come from the fault injector
and the host (an agent process that died, a node deleted), not from the component under test.

Every check returns a list of human-readable violations; an empty list means the invariant held.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.support.leases import recorded

# What a holder may be told when its lease or sandbox is gone: 404 (the sandbox is gone),
# 410 (the lease ended), 502 (the sandbox's agent stopped answering).
CLEAR_ERROR_STATUSES = frozenset({404, 410, 502})


@dataclass(frozen=True)
class Call:
    """One call a client made on a lease, with its wall-clock times and what came back."""

    kind: str  # exec, write, read, renew, release
    started: float
    ended: float
    ok: bool
    status: int | None = None  # HTTP status of an error answer; None on success or with no answer
    code: str = ""
    detail: str = ""
    released: bool | None = None  # a release's answer

    @property
    def lease_error(self) -> bool:
        """The gateway said the lease or its sandbox is gone."""
        return not self.ok and self.status in CLEAR_ERROR_STATUSES

    @property
    def clear_error(self) -> bool:
        """A lease error that says what happened (a message, not only a status)."""
        return self.lease_error and bool(self.detail.strip())

    @property
    def answered(self) -> bool:
        return self.ok or self.status is not None


@dataclass
class ClientLease:
    """A lease as its holder saw it: granted at, for which Pod, and every call made on it."""

    key: str  # the acquire's idempotency key: the same on the Pod's lease annotation
    pod: str
    granted_at: float  # when the grant reached the client (the lease surely existed then)
    expires_at: float
    calls: list[Call] = field(default_factory=list)
    episode: int = 0  # the Pod's episode (a recycling pool's Pod serves several, one at a time)

    @property
    def released_at(self) -> float | None:
        return min((c.started for c in self.calls if c.kind == "release"), default=None)

    @property
    def first_lease_error(self) -> Call | None:
        return next((c for c in self.calls if c.kind != "release" and c.lease_error), None)

    @property
    def held_until(self) -> float:
        """Until when the holder certainly believed it held the sandbox."""
        ends = [self.expires_at]
        if self.released_at is not None:
            ends.append(self.released_at)
        error = self.first_lease_error
        if error is not None:
            ends.append(error.started)
        return min(ends)


@dataclass(frozen=True)
class ObservedLease:
    """A lease as the cluster recorded it on a Pod (its annotation)."""

    key: str  # idempotency key (or holder/acquired_at when the client gave none)
    holder: str
    acquired_at: float
    expires_at: float  # the latest seen: renewals move it
    episode: int = 0  # the Pod's episode it was granted for (its lease id's, `ns.pod~N`)
    run: str | None = None
    # Seen free again, neither released nor expired: a gateway took back a claim (a batch that
    # met its deadline, a caller gone). Only a claim nobody was told of may be (`withdrawn_grants`).
    withdrawn_at: float | None = None

    @property
    def ends_at(self) -> float:
        """When the cluster stopped holding it: its expiry, or its withdrawal if earlier."""
        return self.expires_at if self.withdrawn_at is None else min(self.expires_at, self.withdrawn_at)


@dataclass(frozen=True)
class Reservation:
    """A recycling pool's Pod seen reset and kept for one run: for its episode `episode` next."""

    episode: int
    holder: str
    run: str
    since: float  # when the releasing gateway reserved it (its clock, as the next lease's is)


@dataclass
class PodTruth:
    """One sandbox Pod's life as the cluster's watch showed it."""

    name: str
    uid: str
    node: str | None = None
    first_seen: float = 0.0
    leases: list[ObservedLease] = field(default_factory=list)
    released_at: float | None = None  # first seen with lease-state=released
    deleting_at: float | None = None  # first seen with a deletionTimestamp
    deleted_at: float | None = None  # seen gone
    reservations: list[Reservation] = field(default_factory=list)  # a recycling pool's resets

    @property
    def gone_at(self) -> float | None:
        times = [t for t in (self.deleting_at, self.deleted_at) if t is not None]
        return min(times) if times else None

    @property
    def lease_ends_at(self) -> float | None:
        """When its lease stopped being live (released or expired); None if never leased."""
        if not self.leases:
            return None
        expiry = max(lease.ends_at for lease in self.leases)
        return min(expiry, self.released_at) if self.released_at is not None else expiry

    def reapable_at(self) -> float | None:
        """From when the operator must delete it: released, or its lease expired."""
        return self.lease_ends_at


@dataclass(frozen=True)
class Loss:
    """A sandbox that really died (its agent killed, its node deleted), as the host saw it."""

    pod: str
    at: float
    why: str


def _span(start: float, end: float) -> str:
    return f"[{start:.3f}, {end:.3f}]"


def double_leases(pods: Iterable[PodTruth], clients: Iterable[ClientLease]) -> list[str]:
    """No sandbox was leased twice: one lease per Pod and episode, no overlap between clients.

    A recycling pool's Pod serves several episodes, each after a reset that reserved it for the
    run of the episode before (`recycled_leases`); any other second lease is a double lease.
    """
    violations = []
    for pod in pods:
        for episode in sorted({lease.episode for lease in pod.leases}):
            carried = [o for o in pod.leases if o.episode == episode and o.withdrawn_at is None]
            if len(carried) > 1:
                held = ", ".join(
                    f"{lease.key} {_span(lease.acquired_at, lease.expires_at)}" for lease in carried
                )
                violations.append(
                    f"pod {pod.name} carried {len(carried)} leases in episode {episode}: {held}"
                )
        violations += recycled_leases(pod)
    by_pod: dict[str, list[ClientLease]] = defaultdict(list)
    for lease in clients:
        by_pod[lease.pod].append(lease)
    for pod_name, leases in by_pod.items():
        ordered = sorted(leases, key=lambda c: c.granted_at)
        for index, first in enumerate(ordered):
            for second in ordered[index + 1 :]:
                if first.key == second.key:
                    continue  # one acquire, retried: the same lease handed back
                overlap = second.granted_at < first.held_until and first.granted_at < second.held_until
                if not overlap and first.episode != second.episode:
                    continue  # a recycled Pod's episodes, one after the other (recycled_leases)
                what = "at once" if overlap else "one after the other"
                violations.append(
                    f"pod {pod_name} was leased to two holders {what}: {first.key} "
                    f"{_span(first.granted_at, first.held_until)} and {second.key} "
                    f"{_span(second.granted_at, second.held_until)}"
                )
    return violations


def recycled_leases(pod: PodTruth) -> list[str]:
    """A Pod's episode N > 0 was leased only after it was reset and reserved for N, by that run."""
    violations = []
    reserved = {r.episode: r for r in pod.reservations}
    for lease in pod.leases:
        if lease.episode == 0:
            continue
        kept = reserved.get(lease.episode)
        if kept is None:
            violations.append(f"pod {pod.name} was leased for episode {lease.episode} ({lease.key}) unreset")
        elif (kept.holder, kept.run) != (lease.holder, lease.run) or lease.acquired_at < kept.since:
            violations.append(
                f"pod {pod.name}'s episode {lease.episode} went to {lease.holder}/{lease.run} at "
                f"{lease.acquired_at:.3f}; it was reset for {kept.holder}/{kept.run} at {kept.since:.3f}"
            )
    return violations


def unrecorded_leases(
    clients: Iterable[ClientLease],
    pods: Iterable[PodTruth],
    gaps: Sequence[tuple[float, float]] = (),
) -> list[str]:
    """Every lease a client was granted is on its Pod in the cluster, under the client's key.

    A lease granted inside a gap of the cluster record (the recorder relisted) may be unseen.
    """
    known: dict[str, list[PodTruth]] = defaultdict(list)
    for pod in pods:
        known[pod.name].append(pod)
    violations = []
    for lease in clients:
        seen = known.get(lease.pod, [])
        keys = {observed.key for pod in seen for observed in pod.leases}
        if lease.key in keys:
            continue
        if any(start - 1.0 <= lease.granted_at <= end + 1.0 for start, end in gaps):
            continue
        if not seen:
            violations.append(f"lease {lease.key} on pod {lease.pod}: the cluster never showed that pod")
        else:
            violations.append(
                f"lease {lease.key} on pod {lease.pod}: the pod carried {sorted(keys) or 'no lease'}, "
                "not the holder's"
            )
    return violations


def withdrawn_grants(clients: Iterable[ClientLease], pods: Iterable[PodTruth]) -> list[str]:
    """A claim a gateway took back (its entry free again, unreleased) was never granted to a client.

    The same key may be claimed again on the same Pod by a retry; a grant is fine while one claim
    under its key still stands.
    """
    claims: dict[tuple[str, str], list[ObservedLease]] = defaultdict(list)
    for pod in pods:
        for observed in pod.leases:
            claims[(pod.name, observed.key)].append(observed)
    violations = []
    for lease in clients:
        seen = claims.get((lease.pod, lease.key), [])
        if seen and all(observed.withdrawn_at is not None for observed in seen):
            taken = min(o.withdrawn_at for o in seen if o.withdrawn_at is not None)
            if taken < lease.held_until:
                violations.append(
                    f"lease {lease.key} on pod {lease.pod} was granted at {lease.granted_at:.3f} "
                    f"but its claim was taken back at {taken:.3f}, before it ended"
                )
    return violations


def _loss_for(losses: Iterable[Loss], pod: str, before: float) -> Loss | None:
    return next((loss for loss in losses if loss.pod == pod and loss.at <= before), None)


def leases_lost_while_alive(
    clients: Iterable[ClientLease], losses: Sequence[Loss], slack: float = 1.0
) -> list[str]:
    """No holder lost its lease while its sandbox lived (and it was neither released nor expired).

    A lease error is explained only by a real loss of that Pod before the answer, or by the TTL.
    A first release answered `released: false` (with no earlier failed attempt) means the lease had
    ended without its holder.
    """
    violations = []
    for lease in clients:
        error = lease.first_lease_error
        if error is not None:
            explained = _loss_for(losses, lease.pod, error.ended + slack) is not None
            if not explained and error.ended < lease.expires_at:
                violations.append(
                    f"lease {lease.key} on pod {lease.pod}: {error.kind} at {error.started:.3f} got "
                    f"{error.status} {error.code} ({error.detail!r}) though its sandbox lived"
                )
        releases = [c for c in lease.calls if c.kind == "release"]
        if releases and error is None:
            first = releases[0]
            ended_early = first.ok and first.released is False and first.started < lease.expires_at
            if ended_early and _loss_for(losses, lease.pod, first.ended + slack) is None:
                violations.append(
                    f"lease {lease.key} on pod {lease.pod}: its release at {first.started:.3f} "
                    "found it already ended, though nobody else may end it"
                )
    return violations


def silent_losses(
    clients: Iterable[ClientLease],
    losses: Iterable[Loss],
    slack: float = 1.0,
    hang_seconds: float = 15.0,
) -> list[str]:
    """Every lost sandbox turned into a clear error for its holder, promptly, and nothing after it worked.

    Only calls started `slack` seconds after the loss count (one in flight at that moment may
    still have finished); a holder that made no further call had nothing to be told.
    """
    by_pod: dict[str, list[ClientLease]] = defaultdict(list)
    for lease in clients:
        by_pod[lease.pod].append(lease)
    violations = []
    for loss in losses:
        for lease in by_pod.get(loss.pod, []):
            after = [
                c
                for c in lease.calls
                if c.kind != "release" and c.started >= max(loss.at + slack, lease.granted_at)
            ]
            if not after:
                continue
            first = after[0]
            where = f"lease {lease.key} on pod {loss.pod} ({loss.why} at {loss.at:.3f})"
            if first.ok:
                violations.append(f"{where}: a {first.kind} at {first.started:.3f} still succeeded")
            elif not first.clear_error:
                violations.append(
                    f"{where}: the holder got no clear error but {first.status} {first.code!r} "
                    f"({first.detail!r})"
                )
            if first.ended - first.started > hang_seconds:
                violations.append(
                    f"{where}: the holder waited {first.ended - first.started:.1f}s for its answer"
                )
            for later in after[1:]:
                if later.ok:
                    violations.append(f"{where}: a later {later.kind} at {later.started:.3f} succeeded")
                    break
    return violations


def leased_pods_deleted(pods: Iterable[PodTruth], losses: Sequence[Loss]) -> list[str]:
    """A live lease's Pod is never deleted (only a real loss, a release or the TTL end a lease)."""
    violations = []
    for pod in pods:
        gone = pod.gone_at
        ends = pod.lease_ends_at
        if gone is None or ends is None or gone >= ends:
            continue
        if any(loss.pod == pod.name for loss in losses):
            continue
        violations.append(
            f"pod {pod.name} was deleted at {gone:.3f} while leased (the lease ran to {ends:.3f})"
        )
    return violations


def orphans(
    pods: Iterable[PodTruth],
    now: float,
    reap_seconds: float,
    terminating_seconds: float = 30.0,
    outages: Sequence[tuple[float, float]] = (),
) -> list[str]:
    """No Pod outlives its lease by more than `reap_seconds` (the TTL plus one reconcile, and slack).

    A released Pod, or one whose lease expired, must be on its way out by then; a Pod on its way
    out must be gone within `terminating_seconds`. While the apiserver is down (`outages`) nobody
    can delete anything: the clock of a lease that ended then starts when it is back, and one
    that ended shortly before it stops for as long as it is down.
    """
    violations = []
    for pod in pods:
        reapable = pod.reapable_at()
        for start, end in sorted(outages):
            if reapable is not None and start <= reapable <= end:
                reapable = end
            elif reapable is not None and reapable < start <= reapable + reap_seconds:
                reapable += end - start
        gone = pod.gone_at
        if reapable is not None:
            if gone is None and now - reapable > reap_seconds:
                violations.append(
                    f"pod {pod.name} is still there {now - reapable:.1f}s after its lease ended"
                )
            elif gone is not None and gone - reapable > reap_seconds:
                violations.append(
                    f"pod {pod.name} was deleted only {gone - reapable:.1f}s after its lease ended"
                )
        stuck = pod.deleting_at is not None and pod.deleted_at is None
        if stuck and pod.deleting_at is not None and now - pod.deleting_at > terminating_seconds:
            violations.append(f"pod {pod.name} has been terminating for {now - pod.deleting_at:.1f}s")
    return violations


def check_history(
    clients: Sequence[ClientLease],
    pods: Sequence[PodTruth],
    losses: Sequence[Loss],
    now: float,
    reap_seconds: float,
    gaps: Sequence[tuple[float, float]] = (),
    hang_seconds: float = 15.0,
    outages: Sequence[tuple[float, float]] = (),
) -> list[str]:
    """Every invariant at once; the violations of all of them."""
    return [
        *double_leases(pods, clients),
        *unrecorded_leases(clients, pods, gaps),
        *withdrawn_grants(clients, pods),
        *leases_lost_while_alive(clients, losses),
        *silent_losses(clients, losses, hang_seconds=hang_seconds),
        *leased_pods_deleted(pods, losses),
        *orphans(pods, now, reap_seconds, outages=outages),
    ]


def warm_sandboxes(
    pods: Iterable[Mapping[str, Any]], ready_nodes: set[str], ledgers: Iterable[Mapping[str, Any]] = ()
) -> dict[str, int]:
    """Warm sandboxes per region (free, Ready, not terminating, on a Ready node), from Pod objects.

    A ledger Pod's lease state is its entry in its shard's SandboxLedger (`ledgers`).
    """
    counts: dict[str, int] = defaultdict(int)
    for sandbox in recorded(pods, ledgers).values():
        if sandbox.warm and sandbox.node in ready_nodes:
            counts[sandbox.region] += 1
    return dict(counts)
