"""The gateway's `cluster` label: the member cluster that holds the sandbox, else the gateway's own."""

from __future__ import annotations

import httpx
from prometheus_client import generate_latest

from sandfleet.core import api
from sandfleet.core.api import DEFAULT_CLUSTER
from sandfleet.core.model import SandboxPod, image_key
from sandfleet.gateway.app import Runtime, create_app
from sandfleet.gateway.auth import Authenticator
from sandfleet.gateway.main import kube_app
from sandfleet.gateway.metrics import ClusterUp, GatewayMetrics
from sandfleet.gateway.settings import GatewaySettings
from tests.support.backends import MemoryBackend


def value(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    found = metrics.registry.get_sample_value(name, labels)
    return found


def test_a_group_over_several_clusters_counts_each_and_observes_its_wait_once_in_each() -> None:
    metrics = GatewayMetrics(cluster="home")
    metrics.granted("python", "warm_hit", ["m1", "m2", "m1"], 0.25)
    assert (
        value(metrics, "sandfleet_lease_acquisitions_total", pool="python", result="warm_hit", cluster="m1")
        == 2
    )
    assert (
        value(metrics, "sandfleet_lease_acquisitions_total", pool="python", result="warm_hit", cluster="m2")
        == 1
    )
    for cluster in ("m1", "m2"):
        labels = {"pool": "python", "result": "warm_hit", "cluster": cluster}
        assert value(metrics, "sandfleet_lease_wait_seconds_count", **labels) == 1
        assert value(metrics, "sandfleet_lease_wait_seconds_sum", **labels) == 0.25
    assert (
        value(metrics, "sandfleet_lease_wait_seconds_count", pool="python", result="warm_hit", cluster="home")
        is None
    )


def test_a_single_cluster_gateway_labels_with_its_own_name() -> None:
    metrics = GatewayMetrics(cluster="eu1")
    metrics.granted("python", "queued", ["", ""], 1.0)
    metrics.executed("", 0.5)
    assert (
        value(metrics, "sandfleet_lease_acquisitions_total", pool="python", result="queued", cluster="eu1")
        == 2
    )
    assert (
        value(metrics, "sandfleet_lease_wait_seconds_count", pool="python", result="queued", cluster="eu1")
        == 1
    )
    assert value(metrics, "sandfleet_exec_seconds_count", cluster="eu1") == 1
    assert GatewayMetrics().cluster == DEFAULT_CLUSTER == "default"


def test_a_refused_acquire_is_the_gateways_own_clusters() -> None:
    metrics = GatewayMetrics(cluster="home")
    metrics.refused("python", "timeout", 4, 2.0)
    assert (
        value(metrics, "sandfleet_lease_acquisitions_total", pool="python", result="rejected", cluster="home")
        == 4
    )
    assert (
        value(metrics, "sandfleet_lease_wait_seconds_count", pool="python", result="timeout", cluster="home")
        == 1
    )


def test_an_exec_is_labelled_with_its_sandboxs_cluster() -> None:
    metrics = GatewayMetrics(cluster="home")
    metrics.executed("m2", 0.1)
    assert value(metrics, "sandfleet_exec_seconds_count", cluster="m2") == 1
    assert value(metrics, "sandfleet_exec_seconds_count", cluster="home") is None


def test_cluster_up_follows_whether_the_cluster_serves() -> None:
    serving = [False]
    up = ClusterUp(lambda: {"eu1": serving[0]})
    ((sample,),) = [family.samples for family in up.collect()]
    assert (sample.name, sample.labels, sample.value) == (
        "sandfleet_gateway_member_up",
        {"cluster": "eu1"},
        0,
    )
    serving[0] = True
    ((sample,),) = [family.samples for family in up.collect()]
    assert sample.value == 1


def sandbox(name: str, cluster: str) -> SandboxPod:
    return SandboxPod("ns", name, "python", "us-east1", "1", api.LEASE_FREE, True, False, "127.0.0.1", 1,
                      None, image_key=image_key("img"), cluster=cluster)  # fmt: skip


async def noop() -> None:
    return None


async def test_the_acquire_route_labels_grants_by_member_and_refusals_by_the_gateway() -> None:
    backend = MemoryBackend()
    for name, cluster in (("a", "m1"), ("b", "m1"), ("c", "m2")):
        backend.items.put(sandbox(name, cluster))
    authenticator = Authenticator(static_tokens={}, anonymous_allowed=True)
    runtime = Runtime(backend, authenticator, ready=lambda: True, start=noop, stop=noop, cluster="home")
    app = create_app(runtime)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        granted = await client.post("/v1/leases", json={"pool": "python", "count": 3})
        assert granted.status_code == 201, granted.text
        assert sorted(lease["cluster"] for lease in granted.json()["leases"]) == ["m1", "m1", "m2"]
        refused = await client.post("/v1/leases", json={"pool": "python", "count": 2, "wait_seconds": 0.1})
        assert refused.status_code >= 400, refused.text
    metrics: GatewayMetrics = app.state.parts.metrics
    counted = {
        (s.labels["cluster"], s.labels["result"]): s.value
        for family in metrics.registry.collect()
        if family.name == "sandfleet_lease_acquisitions"
        for s in family.samples
        if s.name.endswith("_total")
    }
    assert counted == {("m1", "warm_hit"): 2, ("m2", "warm_hit"): 1, ("home", "rejected"): 2}


def test_a_single_cluster_gateway_says_its_cluster_is_up_under_its_name() -> None:
    settings = GatewaySettings(insecure_no_agent_key=True, share_warm=False, auth="none", cluster="eu1")
    app = kube_app(settings)  # not started: nothing connects, the cluster is not up yet
    text = generate_latest(app.state.parts.metrics.registry).decode()
    assert 'sandfleet_gateway_member_up{cluster="eu1"} 0.0' in text
