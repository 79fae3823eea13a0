"""The Kubernetes edge's Prometheus metrics: the informer's by watched resource, the ledger's writes."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

# Their own registry, so the gateway can serve them beside its per-app one; the operator serves
# the process-wide default registry, so they are registered there too.
KUBE_REGISTRY = CollectorRegistry(auto_describe=True)

WATCH_EVENTS = Counter(
    "sandfleet_kube_watch_events_total",
    "Watch events received, by resource and type (ADDED, MODIFIED, DELETED, BOOKMARK).",
    ["resource", "type"],
    registry=KUBE_REGISTRY,
)
RELISTS = Counter(
    "sandfleet_kube_relists_total",
    "Full lists of a watched resource, by why: start, gone (410: the history was compacted) or failure.",
    ["resource", "reason"],
    registry=KUBE_REGISTRY,
)
RESTARTS = Counter(
    "sandfleet_kube_watch_restarts_total",
    "Lists or watches that failed and were retried after a backoff.",
    ["resource"],
    registry=KUBE_REGISTRY,
)
LEDGER_WRITES = Counter(
    "sandfleet_ledger_writes_total",
    "Writes of a lease ledger (one per batch of operations on a shard), by result: committed, "
    "conflict (another writer was first: read again and decided afresh) or failed.",
    ["result"],
    registry=KUBE_REGISTRY,
)
LEDGER_BATCH = Histogram(
    "sandfleet_ledger_batch_operations",
    "Lease operations (claims, renewals, releases, resets, retirements) decided per ledger write.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096),
    registry=KUBE_REGISTRY,
)
for _counter in (WATCH_EVENTS, RELISTS, RESTARTS, LEDGER_WRITES, LEDGER_BATCH):
    REGISTRY.register(_counter)
