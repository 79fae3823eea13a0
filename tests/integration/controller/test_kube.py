"""The operator's Pod deletes against the real apiserver: conditional on the version decided on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from sandfleet.controller.kube import Kube
from sandfleet.kube.config import api_client, load_configuration
from tests.support.kube import Kubectl

pytestmark = pytest.mark.cluster


@pytest.fixture
async def kube(kubectl: Kubectl, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Kube]:
    monkeypatch.setenv("KUBECONFIG", str(kubectl.kubeconfig))
    client = Kube(api_client(await load_configuration(), 4))
    yield client
    await client.close()


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"sandfleet.dev/lease": "free"}},
        "spec": {"containers": [{"name": "c", "image": "sandfleet/sandbox:0.1.0"}]},
    }


async def test_a_delete_decided_on_an_older_version_leaves_the_pod(
    kube: Kube, kubectl: Kubectl, namespace: str
) -> None:
    await kube.create_pod(namespace, _pod("raced"))
    decided_on = kubectl.json("get", "pod", "raced", "-n", namespace)["metadata"]["resourceVersion"]
    # What a gateway's claim does between the operator's decision and its delete.
    kubectl("annotate", "pod", "raced", "-n", namespace, "--overwrite", "sandfleet.dev/lease=leased")

    assert await kube.delete_pod(namespace, "raced", resource_version=decided_on) is False
    pod = kubectl.json("get", "pod", "raced", "-n", namespace)
    assert "deletionTimestamp" not in pod["metadata"]

    current = pod["metadata"]["resourceVersion"]
    assert await kube.delete_pod(namespace, "raced", force=True, resource_version=current) is True
    assert await kube.delete_pod(namespace, "raced") is True  # already gone: nothing to do
