"""Benchmark: leases written on the Pods against the lease ledger, one gateway against three, on one cluster.

A burst of concurrent single acquires (each with its own idempotency key, as the client sends them)
spread evenly over the replicas, for each of: the `pod` store (every claim a conditional patch of
its Pod: the design before the ledger) with 1 and with 3 gateways, and the `ledger` store (claims
committed in batches to a shard's SandboxLedger) with 1 and with 3 gateways; 3 gateways share the
warm Pods (each hands out its own share first). The ledger's 1 and 3 gateways run twice: on the
machine's shared cores, and with a CPU quota of their own each (`REPLICA_CPU`, a cgroup, as a Pod's
`limits.cpu` on a cluster): on 2 cores that every replica shares with the apiserver, kwok and the
load generator, that is how "do replicas add capacity" can be read. Per configuration it reports
the burst's p50/p99 and throughput, the apiserver's own count of lease writes per lease (Pod
patches, or ledger patches and creates) and of 409 conflicts among them (machine-independent), and
the CPU of the gateways, the apiserver and the load generator over the burst alone (and, where
replicas have a quota, each one's as read back from its cgroup after the burst), so the load
generator is not what is measured: three client processes in every configuration, each a lean HTTP
client (bench/rawhttp.py). Each gateway has served a few requests first, as a running one has.
Medians over `--repeats` fresh bursts, configurations interleaved. Prints progress, then one JSON
object as its last line.

    .venv/bin/python bench/gateway_replicas.py            # full: 300-lease bursts, 3 repeats
    .venv/bin/python bench/gateway_replicas.py --short    # CI: 90-lease bursts, 1 repeat
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rawhttp
from gateway_leases import TOKEN, Bench, CpuClock, percentile

from sandfleet.core import api
from sandfleet.core.ledger import PODS_PER_SHARD

# Each replica's CPU in the "own CPU" configurations, in cores: as the chart's gateway Pod would get
# from `limits.cpu`. Three of them (0.9) leave the apiserver, kwok and the clients the rest of the 2
# cores: at 0.4 each, three replicas got 0.35 of a core each, the machine and not their quota being
# the bound (2026-12-06).
REPLICA_CPU = 0.3
# name -> (lease store, gateway replicas, each replica's CPU quota or None: the machine's 2 shared cores)
CONFIGS: dict[str, tuple[str, int, float | None]] = {
    "pod store, 1 gateway": (api.STORE_POD, 1, None),
    "pod store, 3 gateways": (api.STORE_POD, 3, None),
    "ledger, 1 gateway": (api.STORE_LEDGER, 1, None),
    "ledger, 3 gateways": (api.STORE_LEDGER, 3, None),
    f"ledger, 1 gateway, {REPLICA_CPU} CPU": (api.STORE_LEDGER, 1, REPLICA_CPU),
    f"ledger, 3 gateways, {REPLICA_CPU} CPU each": (api.STORE_LEDGER, 3, REPLICA_CPU),
}


def log(message: str) -> None:
    print(f"[bench replicas] {message}", file=sys.stderr, flush=True)


def lease_writes(bench: Bench) -> dict[str, float]:
    """The apiserver's own count of lease writes by response code: Pod patches, ledger patches, creates."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(bench.kubectl("get", "--raw", "/metrics")):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            labels = sample.labels
            if sample.name != "apiserver_request_total" or labels.get("subresource"):
                continue
            pod_patch = labels.get("verb") == "PATCH" and labels.get("resource") == "pods"
            ledger = labels.get("verb") in ("PATCH", "POST") and labels.get("resource") == api.LEDGER_PLURAL
            if pod_patch or ledger:
                counts[labels["code"]] = counts.get(labels["code"], 0.0) + sample.value
    return counts


def replicas_seen(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith("sandfleet_gateway_replicas "):
            return float(line.split()[1])
    return 0.0


def measure(
    bench: Bench, name: str, store: str, replicas: int, cpu: float | None, size: int, round_: int
) -> dict[str, Any]:
    prefix = f"r{round_}-{'abcdef'[list(CONFIGS).index(name)]}"
    # Sharded as a pool of at least three shards' size: each of 3 replicas has a shard of its own.
    bench.add_sandboxes(size, prefix, store=store, pool_size=max(size, 3 * PODS_PER_SHARD))
    gateways = [bench.start_gateway(cpu=cpu) for _ in range(replicas)]
    started = list(bench.processes[-replicas:])
    urls = [url for url, _ in gateways]
    if replicas > 1:
        deadline = time.monotonic() + 30
        while not all(replicas_seen(url) == replicas for url in urls):
            if time.monotonic() > deadline:
                raise SystemExit("the gateway replicas did not see each other within 30 s")
            time.sleep(0.2)
    apiserver = bench.cluster.daemons()[1].pid()
    assert apiserver is not None
    pids = [pid for _, pid in gateways]
    writes_before = lease_writes(bench)
    log(f"{name}: burst of {size} acquires")
    run = f"bench-{prefix}-{uuid.uuid4().hex[:4]}"  # released together afterwards
    # CPU over the burst alone: from the clients' first request to their last answer, not over
    # their connecting nor over the scrapes of the apiserver's /metrics around it.
    clock = CpuClock({**{f"gateway {i}": pid for i, pid in enumerate(pids)}, "apiserver": apiserver})
    quotas = bench.quotas if cpu is not None else None  # this configuration's replicas have quotas
    throttled_before = quotas.throttled() if quotas is not None else 0
    burst = rawhttp.burst(urls, TOKEN, size, run, on_start=clock.start, on_end=clock.stop)
    throttled = quotas.throttled() - throttled_before if quotas is not None else 0
    # Proof the quota was in force over the burst: each replica's group, read back after it, has
    # the quota and still holds the replica (throttling alone cannot say: a replica may never get
    # its share of a loaded machine, or need all of it).
    in_force = [quotas.check(pid) for pid in pids] if quotas is not None else []
    writes_after = lease_writes(bench)
    apiserver_cpu = clock.used.pop("apiserver")
    gateway_cpu = sum(clock.used.values())
    released = httpx.post(
        f"{urls[0]}/v1/runs/{run}/release", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120
    )
    if released.status_code != 200:
        raise SystemExit(f"releasing run {run}: {released.status_code} {released.text}")
    for process in started:
        process.terminate()
    for process in started:
        process.wait(timeout=15)
        bench.processes.remove(process)
    delta = {code: writes_after.get(code, 0.0) - writes_before.get(code, 0.0) for code in writes_after}
    latencies = burst["latencies"]
    return {
        "p50_ms": statistics.median(latencies),
        "p99_ms": percentile(latencies, 99),
        "leases_per_s": burst["leases_per_s"],
        "lease_writes_per_lease": sum(delta.values()) / size,
        "conflicts_per_lease": delta.get("409", 0.0) / size,
        "gateway_cpu_ms_per_lease": gateway_cpu / size * 1000,
        # How busy the replicas were over the burst, in cores each (at their quota: they were the bound).
        "gateway_cores_each": gateway_cpu / replicas / burst["wall_s"],
        # With a quota of their own: each replica's, as read back from its cgroup ([]: none).
        "quota": in_force,
        # The 100 ms periods in which a replica used all of its quota and waited (informational: a
        # correct run may have none, when the burst's CPU comes in short spurts).
        "quota_throttled_periods": throttled,
        "apiserver_cpu_ms_per_lease": apiserver_cpu / size * 1000,
        "client_cpu_ms_per_lease": burst["client_cpu_s"] / size * 1000,
        "late_start_s": burst["late_start_s"],  # the last client process's lateness: should be ~0
        # Fairness across replicas: the slowest replica's p50 over the fastest's (1.0: it does not
        # matter which one a caller reached).
        "replica_p50_spread": burst["replica_p50_spread"],
        "load_average_1m": os.getloadavg()[0],
    }


def figures(run: dict[str, Any]) -> dict[str, float]:
    """A configuration's numeric figures: all but the quotas read back."""
    return {key: value for key, value in run.items() if key != "quota"}


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of a configuration's figures over its rounds; the quotas read back, of every round."""
    medians: dict[str, Any] = {
        key: round(statistics.median(run[key] for run in results), 3) for key in figures(results[0])
    }
    medians["quota"] = [in_force for run in results for in_force in run["quota"]]
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--short", action="store_true", help="small sizes for CI")
    parser.add_argument("--repeats", type=int, default=None, help="bursts per configuration")
    args = parser.parse_args()
    size = 90 if args.short else 300
    repeats = args.repeats or (1 if args.short else 3)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp), nodes=30 if args.short else 90)
        try:
            bench.setup()
            for round_ in range(repeats):
                for name, (store, replicas, cpu) in CONFIGS.items():  # interleaved: drift hits all alike
                    runs[name].append(measure(bench, name, store, replicas, cpu, size, round_))
                    log(f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in figures(runs[name][-1]).items()))
        finally:
            bench.teardown()
    medians = {name: summary(results) for name, results in runs.items()}
    pod_1, pod_3, ledger_1, ledger_3, own_1, own_3 = (medians[name] for name in CONFIGS)
    result = {
        "burst_size": size,
        "repeats": repeats,
        "configs": medians,
        # What the ledger changes: the same 300-lease burst through 1 gateway, ledger over Pod store.
        "burst_p50_ledger_over_pod": round(ledger_1["p50_ms"] / pod_1["p50_ms"], 3),
        "burst_p50_ledger_over_pod_3_gateways": round(ledger_3["p50_ms"] / pod_3["p50_ms"], 3),
        "burst_p50_ms_ledger_3_gateways": ledger_3["p50_ms"],
        "throughput_3_over_1_ledger": round(ledger_3["leases_per_s"] / ledger_1["leases_per_s"], 2),
        "throughput_3_over_1_pod": round(pod_3["leases_per_s"] / pod_1["leases_per_s"], 2),
        # Do replicas add capacity when each has CPU of its own, as on a cluster?
        "replica_cpu": REPLICA_CPU,
        "throughput_3_over_1_ledger_own_cpu": round(own_3["leases_per_s"] / own_1["leases_per_s"], 2),
        "agent": "none (acquire only)",
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
