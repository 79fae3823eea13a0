"""The gateway's Prometheus metrics (docs/gateway.md lists them; the dashboard queries them by name).

No label holds a lease id or a sandbox name: each would add series without bound.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sandfleet import __version__
from sandfleet.core.api import DEFAULT_CLUSTER

OTHER_RUNS = "other"
MEMBER_UP = "sandfleet_gateway_member_up"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class RunLabels:
    """Which runs get their own `run` label value: at most `limit` at once, the rest share `other`.

    Run names come from clients: without a bound, every new name is a new set of series, and
    /metrics (and Prometheus) grows without end. A run that is forgotten (ended, or idle long
    enough to be dropped) gives its series and its place back.
    """

    def __init__(self, histogram: Histogram, limit: int) -> None:
        self.histogram = histogram
        self.limit = limit
        self._phases: dict[str, set[str]] = {}  # run -> phases it has series for

    def __len__(self) -> int:
        return len(self._phases)

    def label(self, run: str, phase: str) -> str:
        phases = self._phases.get(run)
        if phases is None:
            if len(self._phases) >= self.limit or run == OTHER_RUNS:
                return OTHER_RUNS
            phases = self._phases[run] = set()
        phases.add(phase)
        return run

    def forget(self, run: str) -> None:
        for phase in self._phases.pop(run, set()):
            with contextlib.suppress(KeyError):
                self.histogram.remove(run, phase)


@dataclass
class GatewayMetrics:
    """One registry per gateway app, so several apps (tests) never collide."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    metric_runs: int = 50  # runs with their own loop-phase series (see RunLabels)
    # The cluster this gateway runs in: the `cluster` label wherever no member cluster holds the
    # sandbox (every sandbox of a single-cluster gateway, and refused acquires, which have none).
    cluster: str = DEFAULT_CLUSTER

    def __post_init__(self) -> None:
        r = self.registry
        self.lease_wait = Histogram(
            "sandfleet_lease_wait_seconds",
            "Time from an acquire request to its lease (or its failure), observed once per member"
            " cluster that holds its sandboxes; a refused acquire is the gateway's own cluster's.",
            ["pool", "result", "cluster"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.acquisitions = Counter(
            "sandfleet_lease_acquisitions_total",
            "Sandboxes leased by outcome (warm_hit, queued, cold) and by the member cluster that holds"
            " them; rejected: asked for and refused, counted in the gateway's own cluster.",
            ["pool", "result", "cluster"],
            registry=r,
        )
        self.leases_active = Gauge(
            "sandfleet_leases_active", "Leases currently held, as this gateway sees them.", registry=r
        )
        self.exec_seconds = Histogram(
            "sandfleet_exec_seconds",
            "Duration of exec calls proxied to sandboxes, by the cluster that holds the sandbox.",
            ["cluster"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.request_duration = Histogram(
            "sandfleet_gateway_request_duration_seconds",
            "Gateway request durations by route template.",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.loop_phase = Histogram(
            "sandfleet_loop_phase_seconds",
            "Durations of the RL loop's phases per run (actor, learner and gateway spans); runs past"
            " the first SANDFLEET_GATEWAY_METRIC_RUNS live ones are labelled `other`.",
            ["run", "phase"],
            buckets=(*LATENCY_BUCKETS, 120, 300),
            registry=r,
        )
        self.runs = RunLabels(self.loop_phase, self.metric_runs)
        self.token_cache_entries = Gauge(
            "sandfleet_gateway_token_cache_entries",
            "TokenReview results the gateway holds (bounded by SANDFLEET_GATEWAY_TOKEN_CACHE_SIZE).",
            registry=r,
        )
        self.policy_staleness = Histogram(
            "sandfleet_policy_staleness_versions",
            "Policy versions behind the run's current one when an episode's lease ended.",
            buckets=(0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64),
            registry=r,
        )
        self.stale_episodes = Counter(
            "sandfleet_policy_stale_episodes_total",
            "Episodes beyond their run's staleness bound: refused, flagged (at acquire) or dropped"
            " (by the learner).",
            ["result"],
            registry=r,
        )
        Info("sandfleet_build", "sandfleet build information.", registry=r).info(
            {"version": __version__, "component": "gateway"}
        )

    def cluster_of(self, sandbox_cluster: str) -> str:
        """The `cluster` label of a sandbox's member cluster ("": the gateway's only one, its own)."""
        return sandbox_cluster or self.cluster

    def granted(self, pool: str, result: str, clusters: Iterable[str], seconds: float) -> None:
        """An acquire's grant: its sandboxes counted per member cluster, its wait once in each."""
        counts: dict[str, int] = {}
        for cluster in map(self.cluster_of, clusters):
            counts[cluster] = counts.get(cluster, 0) + 1
        for cluster, count in (counts or {self.cluster: 0}).items():
            self.acquisitions.labels(pool, result, cluster).inc(count)
            self.lease_wait.labels(pool, result, cluster).observe(seconds)

    def refused(self, pool: str, result: str, count: int, seconds: float) -> None:
        """An acquire that got nothing (`result` says why): no member holds it, so our own cluster."""
        self.acquisitions.labels(pool, "rejected", self.cluster).inc(count)
        self.lease_wait.labels(pool, result, self.cluster).observe(seconds)

    def executed(self, sandbox_cluster: str, seconds: float) -> None:
        """An exec the agent of a sandbox in `sandbox_cluster` ran for `seconds`."""
        self.exec_seconds.labels(self.cluster_of(sandbox_cluster)).observe(seconds)


class ClusterUp(Collector):
    """`sandfleet_gateway_member_up{cluster}`: each cluster the gateway serves from, 1 while it serves.

    0 while it is lost (unreachable) or still starting. `up` says which serve now: a fleet
    gateway's members, or a single-cluster gateway's own cluster (so one dashboard row shows both).
    """

    def __init__(self, up: Callable[[], Mapping[str, bool]]) -> None:
        self.up = up

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            MEMBER_UP,
            "1 while a cluster the gateway serves from (a fleet's member, or its own) serves; 0 while it"
            " is lost (unreachable) or still starting.",
            labels=["cluster"],
        )
        for cluster, serving in self.up().items():
            gauge.add_metric([cluster], 1.0 if serving else 0.0)
        yield gauge
