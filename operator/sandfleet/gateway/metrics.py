"""The gateway's Prometheus metrics (names from the product brief; no lease ids or sandbox names)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from sandfleet import __version__

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass
class GatewayMetrics:
    """One registry per gateway app, so several apps (tests) never collide."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.lease_wait = Histogram(
            "sandfleet_lease_wait_seconds",
            "Time from an acquire request to its lease (or its failure).",
            ["pool", "result"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.acquisitions = Counter(
            "sandfleet_lease_acquisitions_total",
            "Lease acquisitions by outcome: warm_hit, queued, cold, rejected.",
            ["pool", "result"],
            registry=r,
        )
        self.leases_active = Gauge(
            "sandfleet_leases_active", "Leases currently held, as this gateway sees them.", registry=r
        )
        self.exec_seconds = Histogram(
            "sandfleet_exec_seconds",
            "Duration of exec calls proxied to sandboxes.",
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
            "Durations of the RL loop's phases per run (actor, learner and gateway spans).",
            ["run", "phase"],
            buckets=(*LATENCY_BUCKETS, 120, 300),
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
