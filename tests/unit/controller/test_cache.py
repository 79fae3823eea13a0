from __future__ import annotations

from typing import Any

from sandfleet.controller.cache import ClusterCache
from sandfleet.core import api
from sandfleet.core.resources import Resources


def pod(
    name: str, node: str | None = "n1", ready: bool = False, state: str = api.LEASE_FREE, sandbox: bool = True
) -> dict[str, Any]:
    labels = (
        {
            api.MANAGED_BY_LABEL: api.MANAGED_BY,
            api.POOL_LABEL: "python",
            api.LEASE_STATE_LABEL: state,
            api.SANDBOX_REGION_LABEL: "us",
        }
        if sandbox
        else {}
    )
    conditions = [
        {
            "type": "Ready",
            "status": "True" if ready else "False",
            "lastTransitionTime": "2026-01-01T00:00:02Z",
        }
    ]
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "labels": labels,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"nodeName": node, "containers": [{"resources": {"requests": {"cpu": "1"}}}]},
        "status": {"phase": "Running", "conditions": conditions},
    }


class Recorder:
    def __init__(self) -> None:
        self.changed: list[str] = []
        self.started: list[float] = []
        self.leased: list[str] = []

    def cache(self) -> ClusterCache:
        return ClusterCache(
            on_pool_change=self.changed.append,
            on_started=lambda key, sandbox, phases: self.started.append(phases["total"]),
            on_leased=self.leased.append,
        )


def test_sandboxes_usage_startups_and_leases_are_tracked() -> None:
    recorder = Recorder()
    cache = recorder.cache()
    cache.on_pod_event("SYNC", {})
    cache.on_pod_event("ADDED", pod("a"))
    cache.on_pod_event("ADDED", pod("other", sandbox=False))
    cache.pods_listed()
    assert cache.pods_synced.is_set()
    assert [s.name for s in cache.pool_sandboxes("ns/python")] == ["a"]
    assert cache.usage["n1"] == Resources(2000, 0, 2)

    cache.on_pod_event("MODIFIED", pod("a", ready=True))
    assert recorder.started == [2.0]
    assert cache.spinup_seconds("ns/python") == 2.0
    cache.on_pod_event("MODIFIED", pod("a", ready=True, state=api.LEASE_LEASED))
    assert recorder.leased == ["ns/python"]
    assert len(cache.recent_leases("ns/python", now=cache.lease_times["ns/python"][0] + 1)) == 1

    cache.on_pod_event("DELETED", pod("a"))
    assert cache.pool_sandboxes("ns/python") == []
    assert cache.usage["n1"] == Resources(1000, 0, 1)
    assert recorder.changed.count("ns/python") >= 3


def test_a_relist_drops_what_vanished_while_the_watch_was_down() -> None:
    cache = Recorder().cache()
    cache.on_pod_event("SYNC", {})
    cache.on_pod_event("ADDED", pod("a"))
    cache.on_pod_event("ADDED", pod("b"))
    cache.pods_listed()
    cache.on_pod_event("SYNC", {})
    cache.on_pod_event("ADDED", pod("b"))
    cache.pods_listed()
    assert [s.name for s in cache.pool_sandboxes("ns/python")] == ["b"]
    assert cache.usage["n1"] == Resources(1000, 0, 1)


def test_nodes_are_tracked_and_relisted() -> None:
    cache = Recorder().cache()
    node = {
        "metadata": {"name": "n1", "labels": {api.REGION_LABEL: "us"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "allocatable": {"cpu": "4"}},
    }
    cache.on_node_event("SYNC", {})
    cache.on_node_event("ADDED", node)
    cache.nodes_listed()
    assert cache.nodes["n1"].ready
    assert cache.nodes_synced.is_set()
    cache.on_node_event("SYNC", {})
    cache.nodes_listed()
    assert cache.nodes == {}
