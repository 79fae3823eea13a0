"""Gateway fixtures on the real cluster: a pool, its sandbox Pods, and real gateway processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandfleet.core import api
from sandfleet.core.leases import LeaseRecord
from sandfleet.core.ledger import DEFAULT_SHARDS, PODS_PER_SHARD, shard_for
from sandfleet.core.model import image_key
from tests.support import leases as recorded_leases
from tests.support.agent_key import fleet_key_file
from tests.support.kube import Kubectl, wait_until
from tests.support.servers import free_port, wait_until_ready

REGIONS = ("us-east1", "europe-west4", "asia-southeast1")
# The size the test pools' Pods are sharded for: large enough to spread over every ledger shard, so
# replicas have shares of their own (core.ledger.shard_for).
SPREAD = DEFAULT_SHARDS * PODS_PER_SHARD
TOKENS = "actor-token actor-0 python,other\nother-token actor-1 other\n"


def pool_manifest(name: str = "python", max_ttl: int = 3600, store: str = api.STORE_LEDGER) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.POOL_KIND,
        "metadata": {"name": name},
        "spec": {
            "replicas": 0,
            "regions": [{"name": r} for r in REGIONS],
            "template": {"image": "sandfleet/sandbox:test"},
            "lease": {"defaultTTLSeconds": 60, "maxTTLSeconds": max_ttl, "store": store},
        },
    }


def sandbox_pod(
    name: str,
    pool: str,
    region: str,
    image: str = "sandfleet/sandbox:test",
    store: str = api.STORE_LEDGER,
) -> dict[str, Any]:
    """A sandbox Pod as the operator makes it (contract: sandfleet.core.api) for a pool of `store`."""
    labels = {
        api.POOL_LABEL: pool,
        api.SANDBOX_REGION_LABEL: region,
        api.LEASE_STATE_LABEL: api.LEASE_FREE,
        api.IMAGE_KEY_LABEL: image_key(image),
    }
    if store == api.STORE_LEDGER:
        labels[api.LEASE_STATE_LABEL] = api.LEASE_IN_LEDGER
        labels[api.SHARD_LABEL] = shard_for(name, pool, SPREAD)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeSelector": {api.REGION_LABEL: region},
            "containers": [
                {
                    "name": api.SANDBOX_CONTAINER,
                    "image": image,
                    "ports": [{"containerPort": 8000}],
                }
            ],
        },
    }


@dataclass
class Pool:
    kube: Kubectl
    name: str
    store: str = api.STORE_LEDGER

    def add_sandboxes(self, count: int, region: str | None = None, prefix: str = "sb") -> list[str]:
        names = [f"{self.name}-{prefix}-{i:04d}" for i in range(count)]
        pods = [
            sandbox_pod(n, self.name, region or REGIONS[i % len(REGIONS)], store=self.store)
            for i, n in enumerate(names)
        ]
        for start in range(0, len(pods), 200):
            self.kube.apply(pods[start : start + 200])
        wait_until(lambda: self.ready_count(prefix) >= count, timeout=120, what=f"{count} ready sandboxes")
        return names

    def pods(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.kube.json("get", "pods", "-l", f"{api.POOL_LABEL}={self.name}")[
            "items"
        ]
        return items

    def ready_count(self, prefix: str) -> int:
        return sum(
            1
            for p in self.pods()
            if p["metadata"]["name"].startswith(f"{self.name}-{prefix}-")
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p.get("status", {}).get("conditions", [])
            )
        )

    def leases_on_pods(self) -> dict[str, dict[str, Any]]:
        """Pod name -> its lease record as the cluster holds it (on the Pod, or in its ledger): the truth."""
        return recorded_leases.leases(self.kube, f"{api.POOL_LABEL}={self.name}")

    def states(self) -> dict[str, str]:
        """Pod name -> its lease state as the cluster holds it."""
        return recorded_leases.states(self.kube, f"{api.POOL_LABEL}={self.name}")

    def write_claim(self, name: str, lease: LeaseRecord) -> None:
        """Record `lease` on sandbox `name` as a gateway's claim would (a replica that died, say)."""
        recorded_leases.write_lease(self.kube, name, lease)

    def write_reservation(self, name: str, holder: str, run: str, episodes: int) -> None:
        """Record sandbox `name` as a release after a clean reset leaves it: kept for (holder, run)."""
        recorded_leases.write_reservation(self.kube, name, holder, run, episodes)


# Where the pools of the gateway tests keep their leases: the ledger (the default); a test that
# must hold for both stores takes `pool_store` from STORES.
STORES = pytest.mark.parametrize("pool_store", [api.STORE_LEDGER, api.STORE_POD])


@pytest.fixture
def pool_store() -> str:
    return api.STORE_LEDGER


@pytest.fixture
def pool(kube: Kubectl, pool_store: str) -> Pool:
    kube.apply(pool_manifest("python", store=pool_store))
    kube.apply(pool_manifest("other", store=pool_store))
    return Pool(kube, "python", pool_store)


@dataclass
class Gateway:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def client(self, token: str | None = "actor-token", timeout: float = 60) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


GatewayFactory = Callable[..., Gateway]


@pytest.fixture
def start_gateway(kubectl: Kubectl, namespace: str, tmp_path: Path) -> Iterator[GatewayFactory]:
    started: list[Gateway] = []
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKENS)

    def start(auth: str = "static", max_waiting: int = 1000, audiences: tuple[str, ...] = ()) -> Gateway:
        port = free_port()
        log = tmp_path / f"gateway-{port}.log"
        argv = [
            sys.executable, "-m", "sandfleet.cli", "gateway",
            "--host", "127.0.0.1", "--port", str(port), "--namespace", namespace,
            "--auth", auth, "--token-file", str(tokens), "--max-waiting", str(max_waiting),
            "--agent-key-file", str(fleet_key_file(tmp_path)),
            *(f"--token-audience={audience}" for audience in audiences),
        ]  # fmt: skip
        env = dict(os.environ, KUBECONFIG=str(kubectl.kubeconfig))
        with log.open("wb") as out:
            process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        gateway = Gateway(f"http://127.0.0.1:{port}", process, log)
        started.append(gateway)

        wait_until_ready(gateway.url, process, log, timeout=30, what="the gateway to be ready")
        return gateway

    yield start
    for gateway in started:
        if gateway.process.poll() is None:
            gateway.process.terminate()
            try:
                gateway.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                gateway.kill()


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30) -> None:
    wait_until(predicate, timeout=timeout, what=what)


def now() -> float:
    return time.time()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[int]:
    """A real agent on loopback, as a sandbox's agent would run."""
    port = free_port()
    root = tmp_path / "workspace"
    root.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "sandfleet_agent", "--host", "127.0.0.1", "--port", str(port),
         "--root", str(root), "--logs-dir", str(tmp_path / "logs"), "--insecure-no-token"],
    )  # fmt: skip
    wait_until(lambda: _answers(f"http://127.0.0.1:{port}/v1/ready"), timeout=20, what="the agent")
    yield port
    process.terminate()
    process.wait(timeout=10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def loopback_sandbox(pool: Pool, port: int, index: int = 0) -> str:
    """A sandbox Pod whose address is the loopback agent (status written as a kubelet would)."""
    name = f"{pool.name}-loop-{index}"
    pod = sandbox_pod(name, pool.name, "us-east1", store=pool.store)
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": port}]
    pool.kube.apply(pod)
    wait_until(lambda: pool.ready_count("loop") > index, timeout=60, what="the sandbox Pod")
    status = {"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}}
    pool.kube("patch", "pod", name, "--subresource=status", "--type=merge",
              "-p", json.dumps(status))  # fmt: skip
    wait_until(
        lambda: pool.kube.json("get", "pod", name)["status"].get("podIP") == "127.0.0.1",
        timeout=30,
        what="the loopback address to stick",
    )
    return name
