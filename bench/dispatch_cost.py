"""Micro-benchmark: the gateway's CPU per lease as the pool grows (no cluster, no network).

A KubeBackend is fed Pods as its watch would feed them, and its conditional write is answered in
memory, so what is timed is the lease service itself: queueing, picking a warm sandbox, the claim's
bookkeeping and the index update. Each acquire takes one warm sandbox and a new one arrives, so the
pool stays at its size. Prints one JSON object.

    .venv/bin/python bench/dispatch_cost.py [--sizes 100 1000 10000] [--leases 2000]

Each size is measured twice: plain acquires, and acquires carrying an idempotency key as the
client's do (a retried acquire must find its earlier leases: an index lookup, not a scan of the pool).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import replace
from typing import Any

from sandfleet.core import api
from sandfleet.core.leases import LeaseRecord, lease_metadata
from sandfleet.core.model import SandboxPod, image_key
from sandfleet.gateway.kube import KubeBackend, pool_from_object
from sandfleet.gateway.lease_requests import LeaseRequest
from sandfleet.gateway.leasing import LeaseService

IMAGE = "python:3.12"
REGIONS = ("us-east1", "europe-west4", "asia-southeast1")


class InMemoryKube(KubeBackend):
    """The watch-fed index of KubeBackend, with the apiserver's conditional write done in memory."""

    def __init__(self) -> None:
        super().__init__("ns")
        self.version = 0
        self.pods: dict[str, dict[str, Any]] = {}

    def add_pod(self, name: str, region: str, created: int) -> None:
        self.version += 1
        pod = {
            "metadata": {
                "namespace": "ns",
                "name": name,
                "resourceVersion": str(self.version),
                "creationTimestamp": f"2026-11-29T{created // 3600 % 24:02d}:{created // 60 % 60:02d}:"
                f"{created % 60:02d}Z",
                "labels": {
                    api.POOL_LABEL: "python",
                    api.SANDBOX_REGION_LABEL: region,
                    api.LEASE_STATE_LABEL: api.LEASE_FREE,
                    api.IMAGE_KEY_LABEL: image_key(IMAGE),
                },
                "annotations": {},
            },
            "spec": {"containers": [{"name": api.SANDBOX_CONTAINER}]},
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.1",
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        self.pods[f"ns.{name}"] = pod
        self._on_pod("ADDED", pod)

    async def _patch(
        self, sandbox: SandboxPod, metadata: dict[str, Any], conditional: bool = True
    ) -> SandboxPod | None:
        pod = self.pods[sandbox.key]
        if conditional and pod["metadata"]["resourceVersion"] != sandbox.resource_version:
            return None
        self.version += 1
        pod["metadata"]["labels"].update(metadata.get("labels") or {})
        pod["metadata"]["annotations"].update(metadata.get("annotations") or {})
        pod["metadata"]["resourceVersion"] = str(self.version)
        self._on_pod("MODIFIED", pod)
        return self.index.get(sandbox.key)

    async def claim(self, sandbox: SandboxPod, lease: LeaseRecord) -> SandboxPod | None:
        return await self._patch(sandbox, lease_metadata(lease))


async def measure(size: int, leases: int, keys: bool) -> dict[str, float]:
    backend = InMemoryKube()
    backend._pools["python"] = pool_from_object(
        {"metadata": {"namespace": "ns", "name": "python"}, "spec": {"template": {"image": IMAGE}}}
    )
    service = LeaseService(backend)
    created = 0
    for i in range(size):
        backend.add_pod(f"s{i}", REGIONS[i % 3], created)
        created += 1
    request = LeaseRequest(pool="python", holder="bench", wait_seconds=5.0)
    preferring = LeaseRequest(pool="python", holder="bench", regions=("europe-west4",), wait_seconds=5.0)
    timings = []
    for n in range(leases):
        started = time.perf_counter()
        chosen = preferring if n % 2 else request
        # The client sends a fresh idempotency key with every acquire (so it may retry safely).
        await service.acquire(replace(chosen, idempotency_key=f"k{n}") if keys else chosen)
        timings.append(time.perf_counter() - started)
        # The taken sandbox is replaced by a new warm one (outside the timing): the pool stays full.
        backend.add_pod(f"s{size + n}", REGIONS[n % 3], created)
        created += 1
    timings.sort()
    return {
        "mean_us": round(sum(timings) / len(timings) * 1e6, 1),
        "p50_us": round(timings[len(timings) // 2] * 1e6, 1),
        "p99_us": round(timings[int(len(timings) * 0.99)] * 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--leases", type=int, default=2000)
    args = parser.parse_args()
    results = {
        name: {str(size): asyncio.run(measure(size, args.leases, keys)) for size in args.sizes}
        for name, keys in (("acquire", False), ("acquire_with_idempotency_key", True))
    }
    print(json.dumps({"cost_by_pool_size": results}))


if __name__ == "__main__":
    main()
