"""A gateway finds its other replicas on a real apiserver: its Deployment's Ready Pods, by its own Pod."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from sandfleet.core import api
from sandfleet.gateway.run_peers import KubePeers
from sandfleet.kube.api_calls import KubeClient
from sandfleet.kube.config import api_client, load_configuration
from tests.integration.gateway.conftest import REGIONS
from tests.support.kube import Kubectl, wait_until

pytestmark = pytest.mark.cluster

LABELS = {
    "app.kubernetes.io/name": "sandfleet",
    "app.kubernetes.io/instance": "prod",
    "app.kubernetes.io/component": "gateway",
}


def gateway_pod(name: str, labels: dict[str, str] = LABELS, account: str = "gw") -> dict[str, Any]:
    """A Pod like the chart's gateway replicas, on a kwok node (kwok makes it Running and Ready)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "serviceAccountName": account,
            "nodeSelector": {api.REGION_LABEL: REGIONS[0]},
            "containers": [{"name": "gateway", "image": "localhost/sandfleet/sandfleet:test"}],
        },
    }


@pytest.fixture
async def client(kubectl: Kubectl, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[KubeClient]:
    monkeypatch.setenv("KUBECONFIG", str(kubectl.kubeconfig))
    made = KubeClient(api_client(await load_configuration(), 4))
    yield made
    await made.close()


def ip_of(kube: Kubectl, name: str) -> str:
    return str(kube.json("get", "pod", name)["status"].get("podIP") or "")


async def test_the_other_ready_replicas_of_the_same_deployment_and_account_are_found(
    kube: Kubectl, namespace: str, client: KubeClient
) -> None:
    for account in ("gw", "other"):
        kube("create", "serviceaccount", account)
    pods = [
        gateway_pod("gw-a"),
        gateway_pod("gw-b"),
        gateway_pod("gw-c"),
        gateway_pod("gw-other-release", {**LABELS, "app.kubernetes.io/instance": "staging"}),
        gateway_pod("gw-copycat", account="other"),  # the labels, not the account: never asked
    ]
    kube.apply(pods)
    names = [pod["metadata"]["name"] for pod in pods]
    wait_until(lambda: all(ip_of(kube, n) for n in names), timeout=60, what="kwok to give every Pod an IP")

    clock = [0.0]
    peers = KubePeers(namespace, lambda: client, 8080, me="gw-a", clock=lambda: clock[0])
    expected = sorted(f"http://{ip_of(kube, name)}:8080" for name in ("gw-b", "gw-c"))
    assert sorted(await peers.addresses()) == expected
    # A replica going away (deleting: it has a deletionTimestamp, or gone) is not asked once the
    # listing is renewed; within 5 s the last listing is reused.
    kube("delete", "pod", "gw-c", "--wait=false")
    clock[0] = 4.0
    assert sorted(await peers.addresses()) == expected
    clock[0] = 6.0
    assert await peers.addresses() == [f"http://{ip_of(kube, 'gw-b')}:8080"]


async def test_a_gateway_outside_any_pod_is_alone(namespace: str, client: KubeClient) -> None:
    # `sandfleet gateway` run from a workstation: its hostname names no Pod of the namespace.
    assert await KubePeers(namespace, lambda: client, 8080, me="no-such-pod").addresses() == []
