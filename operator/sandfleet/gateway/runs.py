"""Runs in the gateway: the policy registry, staleness checks on acquire, and the loop profiler's spans."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sandfleet.core.leases import LeaseRecord
from sandfleet.core.policy_versions import (
    STALE_LABEL,
    Mode,
    PolicyError,
    RunPolicy,
    decide,
    publish,
    staleness,
)
from sandfleet.core.profile import Profile, Span, check_span, profile
from sandfleet.gateway.auth import Caller
from sandfleet.gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)

MAX_SPANS_PER_RUN = 50_000  # a few minutes of a busy run; older spans fall off first
MAX_RUNS = 256
MAX_TRACKED_LEASES = 100_000
MAX_OWNED_RUNS = 100_000  # owners of runs without a stored policy, in a local gateway's memory
RUN_IDLE_SECONDS = 3600.0  # a run heard from no more for this long has ended: its spans go
# A run name is a Kubernetes label value (it labels the leased Pods): bounded, and safe anywhere.
RUN_NAME = r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$"
_RUN_NAME = re.compile(RUN_NAME)


class StalePolicy(RuntimeError):
    """An acquire for a policy version further behind its run's current version than the bound."""


class InvalidRunName(ValueError):
    """A run name that is not a label value (422)."""


class NotYourRun(PermissionError):
    """A caller acting on a run another caller created (403)."""


def check_run_name(run: str) -> str:
    if not _RUN_NAME.match(run):
        raise InvalidRunName(
            f"run name {run[:80]!r} is not valid: use 1-63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return run


class PolicyStore(Protocol):
    """Where runs' policies live: Kubernetes for the cluster, memory plus a file for the local runtime."""

    async def get(self, run: str) -> RunPolicy | None: ...

    async def put(self, policy: RunPolicy) -> None: ...

    async def owner(self, run: str) -> str | None:
        """Who created `run` (None: nobody yet)."""
        ...

    async def claim(self, run: str, owner: str) -> str:
        """Make `owner` the run's owner unless it has one; the owner it has afterwards."""
        ...


class MemoryPolicyStore:
    """Policies in memory, written through to a JSON file (when given) so a restart keeps them."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._policies: dict[str, RunPolicy] = {}
        # Owners of runs without a policy: memory is enough, as a restart forgets their spans too.
        self._owners: OrderedDict[str, str] = OrderedDict()
        if path is not None and path.exists():
            try:
                for raw in json.loads(path.read_text()).values():
                    policy = RunPolicy.from_json(json.dumps(raw))
                    self._policies[policy.run] = policy
            except (OSError, ValueError, AttributeError) as error:
                log.warning("ignoring unreadable policy file %s: %s", path, error)

    async def get(self, run: str) -> RunPolicy | None:
        return self._policies.get(run)

    async def owner(self, run: str) -> str | None:
        policy = self._policies.get(run)
        return policy.owner if policy is not None and policy.owner else self._owners.get(run)

    async def claim(self, run: str, owner: str) -> str:
        current = await self.owner(run)
        if current is not None:
            return current
        self._owners[run] = owner
        while len(self._owners) > MAX_OWNED_RUNS:
            self._owners.popitem(last=False)
        return owner

    async def put(self, policy: RunPolicy) -> None:
        self._policies[policy.run] = policy
        if self.path is not None:
            data = {run: json.loads(p.to_json()) for run, p in self._policies.items()}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps(data, indent=1, sort_keys=True))
            partial.replace(self.path)  # atomic: a crash never leaves half a file


@dataclass
class _Tracked:
    run: str
    policy_version: int | None
    last_end: float  # wall time the lease was granted or its last exec ended


class Runs:
    """One per gateway: policy versions (through the store) and spans (in memory) for every run."""

    def __init__(
        self,
        store: PolicyStore,
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.time,
        max_spans: int = MAX_SPANS_PER_RUN,
        admins: Iterable[str] = (),
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.max_spans = max_spans
        self.admins = frozenset(admins)
        self._spans: OrderedDict[str, deque[Span]] = OrderedDict()
        self._heard: dict[str, float] = {}  # run -> when its last span came
        self._leases: OrderedDict[str, _Tracked] = OrderedDict()
        self._publishing: dict[str, asyncio.Lock] = {}

    # -- who may act on a run ----------------------------------------------------------------------

    def is_admin(self, caller: Caller) -> bool:
        return caller.name in self.admins or any(group in self.admins for group in caller.groups)

    async def owner(self, run: str) -> str | None:
        """Who created `run`, from the store, so every replica agrees."""
        return await self.store.owner(run)

    async def check(self, run: str, caller: Caller) -> None:
        """NotYourRun unless `caller` may read `run` (its owner, an admin, or nobody owns it yet)."""
        check_run_name(run)
        if self.is_admin(caller):
            return
        owner = await self.owner(run)
        if owner is not None and owner != caller.name:
            raise NotYourRun(
                f"run {run!r} belongs to another caller: use a run name of your own (run names are "
                "first come, first served), or ask the operator to list you in "
                "SANDFLEET_GATEWAY_RUN_ADMINS"
            )

    async def claim(self, run: str, caller: Caller) -> None:
        """Like `check`, and the first caller to act on a run nobody owns becomes its owner.

        The claim is written to the store (a conditional create on Kubernetes), so of two tenants
        racing for a new name through two replicas exactly one gets it.
        """
        await self.check(run, caller)
        unowned = await self.owner(run) is None and not self.is_admin(caller)
        if unowned and await self.store.claim(run, caller.name) != caller.name:
            await self.check(run, caller)  # lost the race: NotYourRun

    # -- policy versions -------------------------------------------------------------------------

    async def publish(
        self,
        run: str,
        version: int,
        staleness_bound: int | None,
        mode: Mode | None,
        caller: Caller | None = None,
    ) -> RunPolicy:
        """Publish a version; with a `caller`, only the run's owner (or an admin) may."""
        owner = ""
        if caller is not None:
            await self.claim(run, caller)
            owner = await self.owner(run) or caller.name
        lock = self._publishing.setdefault(run, asyncio.Lock())
        async with lock:  # read-modify-write of one run's policy, one at a time in this gateway
            previous = await self.store.get(run)
            if caller is not None and previous is not None and previous.owner:
                await self.check(run, caller)  # another replica may have created it meanwhile
            policy = publish(previous, run, version, self.clock(), staleness_bound, mode, owner)
            await self.store.put(policy)
        return policy

    async def policy(self, run: str) -> RunPolicy | None:
        return await self.store.get(run)

    async def admit(self, labels: dict[str, str], policy_version: int | None) -> dict[str, str]:
        """The labels an acquire's leases get, or StalePolicy when the run refuses this version."""
        run = labels.get("run")
        if run is None or policy_version is None:
            return labels
        decision = decide(await self.store.get(run), policy_version)
        if not decision.allowed:
            self.metrics.stale_episodes.labels("refused").inc()
            raise StalePolicy(decision.detail)
        if decision.flagged:
            self.metrics.stale_episodes.labels("flagged").inc()
            return {**labels, STALE_LABEL: str(decision.staleness)}
        return labels

    # -- what the gateway sees itself ------------------------------------------------------------

    def leased(
        self,
        leases: Iterable[LeaseRecord],
        queue_seconds: float,
        claim_seconds: float,
        boot_seconds: float = 0.0,
    ) -> None:
        """Record an acquire's queue, boot and claim time against its run; track its leases.

        Boot is the part of the wait its sandbox was still being created (a cold acquire).
        """
        now = self.clock()
        for index, lease in enumerate(leases):
            if lease.run is None:
                continue
            if index == 0:  # a group waited once: one queue, boot and claim span per acquire
                claim_start = now - claim_seconds
                boot_start = claim_start - boot_seconds  # the sandbox became ready just before its claim
                self._add(lease.run, Span("queue", boot_start - queue_seconds, boot_start, "gateway"))
                if boot_seconds > 0:
                    self._add(lease.run, Span("boot", boot_start, claim_start, "gateway"))
                self._add(lease.run, Span("claim", claim_start, now, "gateway"))
            self._leases[lease.id] = _Tracked(lease.run, lease.policy_version, now)
            while len(self._leases) > MAX_TRACKED_LEASES:
                self._leases.popitem(last=False)

    def exec_done(self, lease_id: str, started: float, seconds: float, phase: str = "exec") -> None:
        """Record a data-plane call and the idle time before it (the model generating, seen from outside)."""
        tracked = self._leases.get(lease_id)
        if tracked is None:
            return
        if started > tracked.last_end:
            self._add(tracked.run, Span("idle", tracked.last_end, started, "gateway"))
        end = started + seconds
        self._add(tracked.run, Span(phase, started, end, "gateway"))
        tracked.last_end = max(end, tracked.last_end)

    async def released(self, lease_id: str) -> None:
        """An episode ended: observe how stale its policy version was by now."""
        tracked = self._leases.pop(lease_id, None)
        if tracked is None or tracked.policy_version is None:
            return
        policy = await self.store.get(tracked.run)
        if policy is not None:
            self.metrics.policy_staleness.observe(staleness(policy.version, tracked.policy_version))

    # -- spans from actors and the learner -------------------------------------------------------

    def record(self, run: str, spans: Iterable[Span], dropped_stale: int = 0) -> int:
        """Add reported spans (ProfileError on a bad one, before any is added); how many."""
        checked = [check_span(span) for span in spans]
        for span in checked:
            self._add(run, span)
        if dropped_stale:
            self.metrics.stale_episodes.labels("dropped").inc(dropped_stale)
        return len(checked)

    def spans(self, run: str, window_seconds: float) -> list[Span]:
        """The run's spans held here that overlap the last `window_seconds`."""
        now = self.clock()
        start = now - window_seconds
        return [s for s in self._spans.get(run, ()) if s.end >= start and s.start <= now]

    def profile(
        self, run: str, window_seconds: float, others: Iterable[Span] = (), notes: Iterable[str] = ()
    ) -> Profile:
        """The run's profile over the spans held here and `others` (the other replicas' share)."""
        now = self.clock()
        found = profile([*self._spans.get(run, ()), *others], now - window_seconds, now)
        found.notes.extend(notes)
        return found

    def _add(self, run: str, span: Span) -> None:
        now = self.clock()
        spans = self._spans.get(run)
        if spans is None:
            spans = self._spans[run] = deque(maxlen=self.max_spans)
        else:
            self._spans.move_to_end(run)
        self._heard[run] = now
        # The run heard from least recently goes first: past the count, or silent for an hour (it
        # ended); its metric series go with it, so they stay bounded whatever names clients send.
        while self._spans:
            oldest = next(iter(self._spans))
            if len(self._spans) <= MAX_RUNS and self._heard[oldest] >= now - RUN_IDLE_SECONDS:
                break
            self._forget(oldest)
        spans.append(span)
        label = self.metrics.runs.label(run, span.phase)
        self.metrics.loop_phase.labels(label, span.phase).observe(span.seconds)

    def _forget(self, run: str) -> None:
        self._spans.pop(run, None)
        self._heard.pop(run, None)
        self.metrics.runs.forget(run)


__all__ = [
    "InvalidRunName",
    "MemoryPolicyStore",
    "NotYourRun",
    "PolicyError",
    "PolicyStore",
    "Runs",
    "StalePolicy",
    "check_run_name",
]
