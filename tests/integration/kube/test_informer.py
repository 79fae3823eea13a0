"""The informer against the real apiserver: an event larger than 1 MiB, and a relist after 410 Gone."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from sandfleet.kube.api_calls import KubeClient
from sandfleet.kube.config import api_client, load_configuration
from sandfleet.kube.informer import SYNC, Informer
from tests.support.kube import Kubectl

pytestmark = pytest.mark.cluster

MIB = 1 << 20
WAIT_SECONDS = 30
ETCD = f"http://127.0.0.1:{os.environ.get('SANDFLEET_ETCD_PORT', '23790')}"  # hack/localcluster's etcd


@pytest.fixture
async def kube(kubectl: Kubectl, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[KubeClient]:
    monkeypatch.setenv("KUBECONFIG", str(kubectl.kubeconfig))
    client = KubeClient(api_client(await load_configuration(), 4))
    yield client
    await client.close()


class Seen:
    """What the informer delivered, with a way to wait for something in it."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.changed = asyncio.Event()

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.events.append((kind, obj))
        self.changed.set()

    async def wait_for(self, what: Callable[[str, dict[str, Any]], bool]) -> dict[str, Any]:
        async with asyncio.timeout(WAIT_SECONDS):
            while True:
                for kind, obj in self.events:
                    if what(kind, obj):
                        return obj
                self.changed.clear()
                await self.changed.wait()


def _named(name: str) -> Callable[[str, dict[str, Any]], bool]:
    return lambda kind, obj: kind == "ADDED" and (obj.get("metadata") or {}).get("name") == name


def _configmap(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


@contextlib.asynccontextmanager
async def _running(informer: Informer) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(informer.run())
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_watch_event_larger_than_1_mib_arrives_whole(kube: KubeClient, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    seen, synced = Seen(), asyncio.Event()
    informer = Informer(kube, path, seen.on_event, synced.set)
    async with _running(informer):
        await asyncio.wait_for(synced.wait(), WAIT_SECONDS)
        # Under the ConfigMap's 1 MiB limit, but newlines are escaped in JSON: the event is ~1.5 MiB.
        blob = "x\n" * 520_000
        await kube.send("POST", path, body=_configmap("big", {"blob": blob}))
        obj = await seen.wait_for(_named("big"))
        assert obj["data"]["blob"] == blob
        assert len(json.dumps({"type": "ADDED", "object": obj})) > MIB
        assert informer.connected
        # The stream goes on after it: a small object behind the big one is seen too.
        await kube.send("POST", path, body=_configmap("small", {"k": "v"}))
        await seen.wait_for(_named("small"))


def _relists_after_gone() -> float:
    labels = {"resource": "events", "reason": "gone"}
    return REGISTRY.get_sample_value("sandfleet_kube_relists_total", labels) or 0.0


def _event(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name},
        "involvedObject": {"kind": "ConfigMap", "name": "x", "namespace": namespace},
        "reason": "Test",
        "message": name,
        "type": "Normal",
    }


async def _compact_etcd() -> None:
    """Drop every revision but the latest, as the apiserver's own compaction does every 5 minutes."""
    async with httpx.AsyncClient(base_url=ETCD, timeout=10) as etcd:
        header = (await etcd.post("/v3/kv/range", json={"key": "Zg=="})).raise_for_status().json()["header"]
        (await etcd.post("/v3/kv/compaction", json={"revision": header["revision"]})).raise_for_status()


class _CompactedBeforeFirstWatch(Informer):
    """After its first list, the history it would watch from is compacted away: the watch gets 410."""

    lists = 0

    async def _list(self, reason: str) -> str:
        version = await super()._list(reason)
        self.lists += 1
        if self.lists == 1:
            for bump in ("bump-1", "bump-2"):  # past the listed revision, so compaction removes it
                await self.kube.send("POST", self.path, body=_event(bump, self.path.split("/")[4]))
            await _compact_etcd()
        return version


async def test_410_gone_relists_and_the_watch_goes_on(kube: KubeClient, namespace: str) -> None:
    # Events: the apiserver keeps no watch cache for them, so a watch reads etcd's (compacted) history.
    path = f"/api/v1/namespaces/{namespace}/events"
    await kube.send("POST", path, body=_event("before", namespace))
    seen, synced = Seen(), asyncio.Event()
    gone_before = _relists_after_gone()
    informer = _CompactedBeforeFirstWatch(kube, path, seen.on_event, synced.set)
    async with _running(informer):
        # Listed twice: once before the 410, once after it.
        await seen.wait_for(lambda *_: sum(_named("before")(k, o) for k, o in seen.events) == 2)
        assert [k for k, _ in seen.events].count(SYNC) == 2
        assert _relists_after_gone() == gone_before + 1
        await kube.send("POST", path, body=_event("after", namespace))
        await seen.wait_for(_named("after"))
        assert informer.lists == 2
        assert informer.connected
