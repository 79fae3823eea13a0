"""The informer's Prometheus metrics, labelled by the watched resource (never by object name)."""

from __future__ import annotations

from prometheus_client import Counter

WATCH_EVENTS = Counter(
    "sandfleet_kube_watch_events_total",
    "Watch events received, by resource and type (ADDED, MODIFIED, DELETED, BOOKMARK).",
    ["resource", "type"],
)
RELISTS = Counter(
    "sandfleet_kube_relists_total",
    "Full lists of a watched resource, by why: start, gone (410: the history was compacted) or failure.",
    ["resource", "reason"],
)
RESTARTS = Counter(
    "sandfleet_kube_watch_restarts_total",
    "Lists or watches that failed and were retried after a backoff.",
    ["resource"],
)
