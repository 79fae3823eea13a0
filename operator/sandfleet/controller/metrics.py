"""The operator's Prometheus metrics (docs/operator.md lists them; the dashboard queries them by name).

Base units (seconds, counts), and no label holds a sandbox name: each would add series without bound.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from sandfleet.core.pods import STARTUP_BUCKETS, STARTUP_LABELS, STARTUP_METRIC

STARTUP_SECONDS = Histogram(
    STARTUP_METRIC,
    "Sandbox spin-up by phase (scheduled, started, ready, total), from the Pod's own timestamps.",
    STARTUP_LABELS,
    buckets=STARTUP_BUCKETS,
)
SANDBOXES = Gauge(
    "sandfleet_sandboxes",
    "Sandboxes of a pool by state (warm, starting, leased, failed) and region.",
    ["pool", "region", "state"],
)
WARM_TARGET = Gauge("sandfleet_pool_warm_target", "Warm sandboxes the operator aims for.", ["pool", "region"])
REGION_CAPACITY = Gauge(
    "sandfleet_pool_region_capacity", "More sandboxes the region's nodes could take now.", ["pool", "region"]
)
LEASES_OBSERVED = Counter(
    "sandfleet_pool_leases_observed_total",
    "Sandboxes the operator saw go from free to leased (the demand the warm target follows).",
    ["pool"],
)
RECONCILES = Counter("sandfleet_operator_reconciles_total", "Pool reconcile passes.", ["result"])
RECONCILE_SECONDS = Histogram(
    "sandfleet_operator_reconcile_duration_seconds",
    "Time to plan and apply one pool reconcile pass.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
POD_OPERATIONS = Counter(
    "sandfleet_operator_pod_operations_total",
    "Sandbox Pod creations and deletions by reason and result.",
    ["operation", "reason", "result"],
)
LEADER = Gauge("sandfleet_operator_leader", "1 while this replica holds the leader lease.")

STATES = ("warm", "starting", "leased", "failed")


class ClusterLabelled(Collector):
    """Every family `source` collects, each sample with `cluster=<name>` added (or set).

    One fleet's operators are scraped by one Prometheus: the label says which member cluster a
    series is from, without every metric above declaring it.
    """

    def __init__(self, source: Collector, cluster: str) -> None:
        self.source = source
        self.cluster = cluster

    def collect(self) -> Iterator[Metric]:
        for family in self.source.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [
                sample._replace(labels={**sample.labels, "cluster": self.cluster})
                for sample in family.samples
            ]
            yield labelled


def cluster_registry(cluster: str, source: Collector = REGISTRY) -> CollectorRegistry:
    """What the operator's /metrics serves: the default registry's metrics, labelled with `cluster`."""
    registry = CollectorRegistry()
    registry.register(ClusterLabelled(source, cluster))
    return registry
