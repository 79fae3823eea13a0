"""The informer's Prometheus metrics, labelled by the watched resource (never by object name)."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter

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
for _counter in (WATCH_EVENTS, RELISTS, RESTARTS):
    REGISTRY.register(_counter)
