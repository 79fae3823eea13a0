"""Benchmark: a step's batch of leases, with the lease ledger against leases written on each Pod.

On a cluster of its own, one `sandfleet gateway` (the real process) leases from Pods made the way
the operator makes them, for each lease store:

1. batches of 300 (`count` 300, `min_count` 1), one at a time, for the `pod` store (every claim a
   conditional patch of its Pod, the design before the ledger) and the `ledger` store, rounds
   interleaved: the time at the gateway (its `timings.total_ms`) and at the client, and the
   apiserver's own count of lease writes per lease;
2. batches of 4,096 from the ledger store (the Pod store takes about a minute for one);
3. sustained episodes through a recycling pool: workers each acquire a batch for their run, then
   release the run (one request), over and over; every released sandbox is reset by its agent and
   kept for its run, so no Pod is created or deleted. The Pods' agents are one stand-in process
   answering every reset clean (bench/stub_agent.py; kwok gives the Pods loopback addresses):
   what a real reset costs is bench/sandbox_reset.py's and the real node's. Episodes per second,
   and the apiserver's own count of writes per episode (the lease ledger's, and everything else).

CPU of the gateway, the apiserver, the load generator and the stand-in agent is reported beside
each, so the load generator is not what is measured. Prints progress, then one JSON object as its
last line.

    .venv/bin/python bench/lease_batches.py            # full: 5 x 300 per store, 2 x 4,096, 20 s
    .venv/bin/python bench/lease_batches.py --short    # CI: 2 x 100 per store, 1 x 512, 3 s
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_leases import TOKEN, Bench, log_to
from kubebench import process_cpu_seconds
from localbench import free_port

from sandfleet.core import api

log = log_to("lease_batches")
LOOPBACK_PODS = "127.1.0.0/16"
RECYCLING = "recycling"


def apiserver_writes(bench: Bench) -> Counter[str]:
    """The apiserver's own count of write requests, by "VERB resource code"."""
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(bench.kubectl("get", "--raw", "/metrics")):
        for sample in family.samples:
            labels = sample.labels
            if sample.name != "apiserver_request_total":
                continue
            if labels.get("verb") not in ("POST", "PUT", "PATCH", "DELETE", "APPLY"):
                continue
            resource_name = "/".join(filter(None, (labels.get("resource"), labels.get("subresource"))))
            counts[f"{labels['verb']} {resource_name} {labels['code']}"] += int(sample.value)
    return counts


def lease_writes(delta: Counter[str]) -> int:
    """Of a delta of writes, those that write leases: Pod patches and ledger creates or patches."""
    return sum(
        n
        for key, n in delta.items()
        if key.startswith(("PATCH pods ", f"PATCH {api.LEDGER_PLURAL} ", f"POST {api.LEDGER_PLURAL} "))
    )


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Cpu:
    """CPU seconds of some processes (and this one) between start() and the figures' reading."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.before: dict[str, float] = {}

    def start(self) -> None:
        self.before = {name: process_cpu_seconds(pid) for name, pid in self.pids.items()}
        self.before["load generator"] = self_cpu()

    def per(self, count: int) -> dict[str, float]:
        """Ms of CPU per item, for each process, since start()."""
        now = {name: process_cpu_seconds(pid) for name, pid in self.pids.items()}
        now["load generator"] = self_cpu()
        return {name: round((now[name] - self.before[name]) / count * 1000, 3) for name in now}


async def batches(url: str, pool_name: str, size: int, rounds: int, run: str) -> list[dict[str, float]]:
    """`rounds` batch acquires of `size`, one at a time, each released (by its run) after."""
    found = []
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300) as client:
        await client.get("/healthz")  # a connection open, as a trainer's would be
        for _ in range(rounds):
            body = {
                "pool": pool_name,
                "count": size,
                "min_count": 1,
                "wait_seconds": 60,
                "labels": {"run": run},
            }
            started = time.perf_counter()
            response = await client.post("/v1/leases", json=body)
            granted = response.json()
            client_ms = (time.perf_counter() - started) * 1000
            if response.status_code != 201 or granted["granted"] != size:
                raise SystemExit(f"batch acquire failed: {response.status_code} {response.text[:500]}")
            found.append(
                {
                    "gateway_ms": float(granted["timings"]["total_ms"]),
                    "claim_ms": float(granted["timings"]["claim_ms"]),
                    "client_ms": client_ms,
                }
            )
            released = await client.post(f"/v1/runs/{run}/release")
            if released.status_code != 200 or len(released.json()["released"]) != size:
                raise SystemExit(f"release failed: {released.status_code} {released.text[:300]}")
    return found


async def sustained(url: str, workers: int, size: int, seconds: float) -> dict[str, Any]:
    """`workers` loops of (acquire a batch of `size` for the worker's run, release the run) for `seconds`."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    episodes = [0] * workers
    acquire_ms: list[float] = []
    release_ms: list[float] = []
    deadline = 0.0

    async def worker(index: int, client: httpx.AsyncClient) -> None:
        run = f"{RECYCLING}-{index}"
        # At least one cycle each, however late a worker starts: a slow machine still measures something.
        while not episodes[index] or time.monotonic() < deadline:
            body = {
                "pool": RECYCLING,
                "count": size,
                "min_count": size,
                "wait_seconds": 60,
                "labels": {"run": run},
            }
            started = time.perf_counter()
            response = await client.post("/v1/leases", json=body)
            if response.status_code != 201:
                raise SystemExit(f"acquire failed: {response.status_code} {response.text[:300]}")
            acquire_ms.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            released = await client.post(f"/v1/runs/{run}/release")
            if released.status_code != 200 or len(released.json()["released"]) != size:
                raise SystemExit(f"release failed: {released.status_code} {released.text[:300]}")
            release_ms.append((time.perf_counter() - started) * 1000)
            episodes[index] += size

    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300) as client:
        started = time.monotonic()
        deadline = started + seconds
        await asyncio.gather(*(worker(i, client) for i in range(workers)))
        elapsed = time.monotonic() - started
    return {
        "episodes": sum(episodes),
        "seconds": round(elapsed, 2),
        "episodes_per_s": round(sum(episodes) / elapsed, 1),
        "acquire_p50_ms": round(statistics.median(acquire_ms), 1),
        "release_p50_ms": round(statistics.median(release_ms), 1),
    }


def pool(name: str, store: str, recycle: bool = False) -> dict[str, Any]:
    """A pool of its own per store (and the recycling one): a shelf never mixes their Pods."""
    spec: dict[str, Any] = {
        "regions": [{"name": "us-east1"}, {"name": "europe-west4"}, {"name": "asia-southeast1"}],
        "template": {"image": "sandfleet/sandbox:bench"},
        "lease": {"store": store},
    }
    if recycle:
        spec["recycle"] = {"maxEpisodes": 10_000, "maxSeconds": 86_400}
    return {"apiVersion": api.API_VERSION, "kind": api.POOL_KIND, "metadata": {"name": name}, "spec": spec}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--short", action="store_true", help="small sizes for CI")
    args = parser.parse_args()
    size, rounds = (100, 2) if args.short else (300, 5)
    big, big_rounds = (512, 1) if args.short else (4096, 2)
    workers, step, seconds = (2, 128, 3.0) if args.short else (4, 256, 20.0)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result: dict[str, Any] = {"batch_size": size, "big_batch_size": big, "sustained_workers": workers}
    with tempfile.TemporaryDirectory() as tmp:
        pods = 2 * size * rounds + big * big_rounds + workers * step
        bench = Bench(Path(tmp), nodes=max(30, 3 * -(-pods // (3 * 60)) + 3), pod_cidr=LOOPBACK_PODS)
        stub: subprocess.Popen[bytes] | None = None
        try:
            bench.setup()
            agent_port = free_port()
            stub = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("stub_agent.py")), "--port", str(agent_port)],
                stdout=subprocess.PIPE,
            )
            pools = [pool(store, store) for store in (api.STORE_POD, api.STORE_LEDGER)]
            pools.append(pool(RECYCLING, api.STORE_LEDGER, recycle=True))
            listed = {"apiVersion": "v1", "kind": "List", "items": pools}
            bench.kubectl("apply", "-f", "-", stdin=json.dumps(listed))
            for store in (api.STORE_POD, api.STORE_LEDGER):
                bench.add_sandboxes(size * rounds, store, store=store, pool_size=size * rounds, pool=store)
            bench.add_sandboxes(big * big_rounds, "big", pool_size=big * big_rounds, pool=api.STORE_LEDGER)
            bench.add_sandboxes(workers * step, "rec", port=agent_port, pool=RECYCLING)
            # One tenant asks for a whole step's batch: above the default per-tenant quota (2,000).
            quota = 2 * big + workers * step + 2 * size
            url, pid = bench.start_gateway(settings={"SANDFLEET_GATEWAY_MAX_LEASES_PER_TENANT": str(quota)})
            apiserver = bench.cluster.daemons()[1].pid()
            assert apiserver is not None
            cpu = Cpu({"gateway": pid, "apiserver": apiserver})

            # 1. Batches of `size`, each store in turn, rounds interleaved (drift hits both alike).
            per_store: dict[str, list[dict[str, float]]] = {api.STORE_POD: [], api.STORE_LEDGER: []}
            writes: Counter[str] = Counter()
            for round_ in range(rounds):
                for store in per_store:
                    before = apiserver_writes(bench)
                    per_store[store] += asyncio.run(batches(url, store, size, 1, f"b-{store}"))
                    writes[store] += lease_writes(apiserver_writes(bench) - before)
                    log(f"batch of {size}, {store} store, round {round_ + 1}: {per_store[store][-1]}")
            for store, found in per_store.items():
                result[f"batch_{store}"] = {
                    "gateway_p50_ms": round(statistics.median(r["gateway_ms"] for r in found), 1),
                    "claim_p50_ms": round(statistics.median(r["claim_ms"] for r in found), 1),
                    "client_p50_ms": round(statistics.median(r["client_ms"] for r in found), 1),
                    "client_max_ms": round(max(r["client_ms"] for r in found), 1),
                    # acquire and release: what a step costs the apiserver in lease writes, per sandbox
                    "lease_writes_per_lease": round(writes[store] / (size * rounds), 3),
                }
            ledger_batch, pod_batch = result[f"batch_{api.STORE_LEDGER}"], result[f"batch_{api.STORE_POD}"]
            result["batch_gateway_p50_ms"] = ledger_batch["gateway_p50_ms"]
            result["batch_client_p50_ms"] = ledger_batch["client_p50_ms"]
            result["batch_p50_ledger_over_pod"] = round(
                ledger_batch["client_p50_ms"] / pod_batch["client_p50_ms"], 3
            )

            # 2. Big batches from the ledger store.
            cpu.start()
            found = asyncio.run(batches(url, api.STORE_LEDGER, big, big_rounds, "big"))
            result["big_batch"] = {
                "gateway_p50_ms": round(statistics.median(r["gateway_ms"] for r in found), 1),
                "client_p50_ms": round(statistics.median(r["client_ms"] for r in found), 1),
                "client_max_ms": round(max(r["client_ms"] for r in found), 1),
                "cpu_ms_per_lease": cpu.per(big * big_rounds),
            }
            result["big_batch_client_p50_s"] = round(result["big_batch"]["client_p50_ms"] / 1000, 3)
            log(f"batches of {big}: {result['big_batch']}")

            # 3. Sustained episodes through the recycling pool (warm up: one cycle per worker, so
            # every Pod has been reset once).
            asyncio.run(sustained(url, workers, step, 0.0))
            before = apiserver_writes(bench)
            cpu.pids["stand-in agent"] = stub.pid
            cpu.start()
            loop = asyncio.run(sustained(url, workers, step, seconds))
            delta = apiserver_writes(bench) - before
            loop["cpu_ms_per_episode"] = cpu.per(loop["episodes"])
            loop["writes_per_episode"] = round(sum(delta.values()) / loop["episodes"], 4)
            loop["lease_writes_per_episode"] = round(lease_writes(delta) / loop["episodes"], 4)
            loop["writes"] = dict(delta)
            result["sustained"] = loop
            result["sustained_episodes_per_s"] = loop["episodes_per_s"]
            result["sustained_writes_per_episode"] = loop["writes_per_episode"]
            log(f"sustained: {loop}")
        finally:
            if stub is not None:
                stub.terminate()
                stub.wait(timeout=15)
            bench.teardown()
    result["load_average_1m"] = os.getloadavg()[0]
    result["agent"] = "a stand-in answering every reset clean (bench/stub_agent.py)"
    print(json.dumps(result))


if __name__ == "__main__":
    main()
