"""Benchmark: leases through the gateway on the local cluster (burst, sustained, first exec, CPU).

Prints progress, then one JSON object as its last line. Sandbox Pods are created the way the
operator creates them (the operator's own fill rate is bench/pool_fill.py's business); their
readiness comes from kwok, and exec goes to a real agent on loopback.

    .venv/bin/python bench/gateway_leases.py            # full: 300-lease burst, 3,000 cycles
    .venv/bin/python bench/gateway_leases.py --short    # CI: 100-lease burst, 200 cycles

The burst comes from three processes of the lean client (bench/rawhttp.py), each acquire with its
own idempotency key as sandfleet.client sends them; the rest is httpx, one request at a time or 32.

A step's batch of leases, and the lease ledger against leases written on each Pod, are
bench/lease_batches.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack"))

import rawhttp  # noqa: E402
from cpuquota import CpuQuotas  # noqa: E402
from kubebench import process_cpu_seconds  # noqa: E402
from localbench import free_port  # noqa: E402

from localcluster import build  # noqa: E402
from localcluster.cluster import POD_CIDR, LocalCluster, Ports, Topology  # noqa: E402
from sandfleet.core import api  # noqa: E402
from sandfleet.core.ledger import shard_for  # noqa: E402
from sandfleet.core.model import image_key  # noqa: E402

TOKEN = "bench-token"
SEQUENTIAL = 50
READY_JSONPATH = (
    "jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=='Ready')].status}{'\\n'}{end}"
)


def log_to(name: str) -> Callable[[str], None]:
    """A progress logger for one benchmark (stderr, each line marked with its name)."""

    def log(message: str) -> None:
        print(f"[bench {name}] {message}", file=sys.stderr, flush=True)

    return log


log = log_to("gateway")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def thin(values: list[float], most: int = 400) -> list[float]:
    """A sorted sample cut to at most `most` evenly spaced quantiles, rounded to microseconds."""
    ordered = sorted(values)
    if len(ordered) > most:
        step = (len(ordered) - 1) / (most - 1)
        ordered = [ordered[round(i * step)] for i in range(most)]
    return [round(v, 3) for v in ordered]


class Bench:
    def __init__(self, workdir: Path, nodes: int, pod_cidr: str = POD_CIDR) -> None:
        self.nodes = nodes
        # A cluster of its own: the shared test cluster has neither the room nor the quiet.
        self.cluster = LocalCluster(
            Path("/tmp/sandfleet-bench-gateway"),
            Ports(apiserver=17443, etcd_client=24790, etcd_peer=24800,
                  controller_manager=11257, scheduler=11259, kwok=11247),
            pod_cidr,
        )  # fmt: skip
        self.workdir = workdir
        self.namespace = f"bench-{uuid.uuid4().hex[:8]}"
        self.kubeconfig = self.cluster.kubeconfig
        self.processes: list[subprocess.Popen[bytes]] = []
        self.quotas: CpuQuotas | None = None  # made when a gateway first asks for a CPU quota
        self.warmed_once = False

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        result = subprocess.run(
            [str(build.binary("kubectl")), f"--kubeconfig={self.kubeconfig}", "-n", self.namespace, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def setup(self) -> None:
        log(f"starting a benchmark cluster ({self.nodes} simulated nodes)")
        self.cluster.up(Topology(nodes=self.nodes, gpu_nodes=0))
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "manifests" / "crds"))
        subprocess.run(
            [str(build.binary("kubectl")), f"--kubeconfig={self.kubeconfig}", "create", "ns", self.namespace],
            check=True,
            capture_output=True,
        )
        self.add_pool("bench")

    def add_pool(self, name: str) -> None:
        pool = {
            "apiVersion": api.API_VERSION,
            "kind": api.POOL_KIND,
            "metadata": {"name": name},
            "spec": {
                "regions": [{"name": "us-east1"}, {"name": "europe-west4"}, {"name": "asia-southeast1"}],
                "template": {"image": "sandfleet/sandbox:bench"},
            },
        }
        self.kubectl("apply", "-f", "-", stdin=json.dumps(pool))

    def add_sandboxes(
        self,
        count: int,
        prefix: str,
        port: int = 8000,
        store: str = api.STORE_LEDGER,
        pool_size: int = 0,
        pool: str = "bench",
    ) -> None:
        """`count` Ready sandbox Pods as the operator makes them for a pool of `store`.

        A ledger pool's Pods are sharded for `pool_size` sandboxes (core.ledger.shard_for; `count`
        when 0).
        """
        regions = ("us-east1", "europe-west4", "asia-southeast1")
        started = time.monotonic()

        def labels(name: str, region: str) -> dict[str, str]:
            found = {
                api.POOL_LABEL: pool,
                api.SANDBOX_REGION_LABEL: region,
                api.LEASE_STATE_LABEL: api.LEASE_FREE,
                api.IMAGE_KEY_LABEL: image_key("sandfleet/sandbox:bench"),
            }
            if store == api.STORE_LEDGER:
                found[api.LEASE_STATE_LABEL] = api.LEASE_IN_LEDGER
                found[api.SHARD_LABEL] = shard_for(name, pool, pool_size or count)
            return found

        for first in range(0, count, 250):
            pods = [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{prefix}-{i:05d}",
                        "labels": labels(f"{prefix}-{i:05d}", regions[i % 3]),
                    },
                    "spec": {
                        "nodeSelector": {api.REGION_LABEL: regions[i % 3]},
                        "containers": [
                            {
                                "name": api.SANDBOX_CONTAINER,
                                "image": "sandfleet/sandbox:bench",
                                "ports": [{"containerPort": port}],
                            }
                        ],
                    },
                }
                for i in range(first, min(first + 250, count))
            ]
            self.kubectl(
                "create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods})
            )
        while True:
            ready = self.kubectl("get", "pods", "-l", f"{api.POOL_LABEL}={pool}", "-o", READY_JSONPATH)
            lines = ready.splitlines()
            done = sum(1 for line in lines if line.startswith(prefix) and line.endswith("True"))
            if done >= count:
                break
            log(f"{done}/{count} sandbox Pods ready")
            time.sleep(1)
        log(f"{count} sandbox Pods ready in {time.monotonic() - started:.1f}s")

    def agent_key_file(self) -> Path:
        """A fleet key for the gateway (the loopback agent checks no per-Pod token)."""
        path = self.workdir / "agent-key"
        path.write_text(secrets.token_hex(32) + "\n")
        return path

    def start_gateway(
        self, *extra_args: str, settings: dict[str, str] | None = None, cpu: float | None = None
    ) -> tuple[str, int]:
        """A ready, warmed gateway process; `settings` are SANDFLEET_GATEWAY_* variables for it alone.

        `cpu`: its own CPU quota in cores (as a Pod's `limits.cpu`), else it shares the machine's.
        """
        tokens = self.workdir / "tokens"
        tokens.write_text(f"{TOKEN} bench\n")
        port = free_port()
        log_path = self.workdir / f"gateway-{port}.log"
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), **(settings or {}))
        argv = [
            sys.executable, "-m", "sandfleet.cli", "gateway", "--host", "127.0.0.1",
            "--port", str(port), "--namespace", self.namespace, "--auth", "static",
            "--token-file", str(tokens), "--max-waiting", "100000",
            "--agent-key-file", str(self.agent_key_file()), *extra_args,
        ]  # fmt: skip
        process = subprocess.Popen(argv, env=env, stderr=log_path.open("wb"))
        self.processes.append(process)
        if cpu is not None:
            self.quotas = self.quotas or CpuQuotas(f"sandfleet-bench-{self.namespace}")
            self.quotas.confine(process.pid, cpu, f"gateway-{port}")
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    self._warm(url, process.pid)
                    return url, process.pid
            except httpx.TransportError:
                time.sleep(0.2)
        raise SystemExit(f"gateway not ready: {log_path.read_text()[-2000:]}")

    def _warm(self, url: str, pid: int) -> None:
        """A few requests that take no sandbox, as a running gateway has served.

        FastAPI builds a router's routes (their pydantic models) on the first request that reaches
        it: tens of ms of CPU that a burst through a fresh replica would count, once per replica.
        """
        headers = {"Authorization": f"Bearer {TOKEN}"}
        before = process_cpu_seconds(pid)
        for _ in range(3):
            listed = httpx.get(f"{url}/v1/leases", headers=headers, timeout=10)
            refused = httpx.post(f"{url}/v1/leases", headers=headers, json={}, timeout=10)  # no pool named
            if (listed.status_code, refused.status_code) != (200, 422):
                raise SystemExit(f"warming {url}: {listed.status_code} {listed.text}; {refused.status_code}")
        if not self.warmed_once:
            self.warmed_once = True
            used_ms = (process_cpu_seconds(pid) - before) * 1000
            log(f"a fresh gateway's first 6 requests (no sandbox taken): {used_ms:.0f} ms of CPU")

    def start_agent(self) -> int:
        port = free_port()
        root = self.workdir / "workspace"
        root.mkdir(exist_ok=True)
        argv = [
            sys.executable, "-m", "sandfleet_agent", "--host", "127.0.0.1", "--port", str(port),
            "--root", str(root), "--logs-dir", str(self.workdir / "agent-logs"), "--insecure-no-token",
        ]  # fmt: skip
        self.processes.append(subprocess.Popen(argv, stderr=subprocess.DEVNULL))
        return port

    def point_at_loopback(self, names: list[str]) -> None:
        status = json.dumps({"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}})
        for name in names:
            self.kubectl("patch", "pod", name, "--subresource=status", "--type=merge", "-p", status)

    def teardown(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait(timeout=15)
        if self.quotas is not None:
            self.quotas.remove()
        self.cluster.down(quiet=True)


class CpuClock:
    """CPU seconds each of some processes used between `start` and `stop`."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.started: dict[str, float] = {}
        self.used: dict[str, float] = {}

    def start(self) -> None:
        self.started = {name: process_cpu_seconds(pid) for name, pid in self.pids.items()}

    def stop(self) -> None:
        self.used = {name: process_cpu_seconds(pid) - self.started[name] for name, pid in self.pids.items()}


async def sequential(url: str, count: int) -> list[float]:
    """`count` acquires one after another (nothing queued): the latency floor of a warm lease, ms."""
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
    ) as client:
        latencies = []
        for _ in range(count):
            started = time.perf_counter()
            response = await client.post("/v1/leases", json={"pool": "bench"})
            latencies.append((time.perf_counter() - started) * 1000)
            if response.status_code != 201:
                raise SystemExit(f"acquire failed: {response.status_code} {response.text}")
        return latencies


async def cycles(url: str, total: int, concurrency: int) -> float:
    """Lease+release cycles per second with `concurrency` workers, `total` cycles in all."""
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60,
        limits=httpx.Limits(max_connections=concurrency),
    ) as client:  # fmt: skip
        remaining = [total]

        async def worker() -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                response = await client.post("/v1/leases", json={"pool": "bench", "wait_seconds": 30})
                lease_id = response.json()["leases"][0]["id"]
                await client.delete(f"/v1/leases/{lease_id}")

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return total / (time.perf_counter() - started)


async def first_exec(url: str, rounds: int) -> tuple[list[float], list[float]]:
    """Acquire -> first exec `true` (ms), and then exec `true` round trips (ms)."""
    firsts, execs = [], []
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
    ) as client:
        for _ in range(rounds):
            started = time.perf_counter()
            response = await client.post("/v1/leases", json={"pool": "exec"})
            if response.status_code != 201:
                raise SystemExit(f"acquire failed: {response.status_code} {response.text}")
            lease_id = response.json()["leases"][0]["id"]
            result = await client.post(f"/v1/leases/{lease_id}/exec", json={"argv": ["true"]})
            firsts.append((time.perf_counter() - started) * 1000)
            if result.status_code != 200 or result.json()["exit_code"] != 0:
                raise SystemExit(
                    f"exec failed: {result.status_code} {result.text!r} {dict(result.headers)}; "
                    f"lease {response.json()}"
                )
            for _ in range(20):
                t = time.perf_counter()
                await client.post(f"/v1/leases/{lease_id}/exec", json={"argv": ["true"]})
                execs.append((time.perf_counter() - t) * 1000)
            await client.delete(f"/v1/leases/{lease_id}")
    return firsts, execs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="small sizes for CI")
    args = parser.parse_args()
    burst_size, cycle_count, exec_rounds = (100, 200, 5) if args.short else (300, 3000, 20)
    # A SIGTERM (CI timeout, ^C from a wrapper) still runs the teardown below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory() as tmp:
        # Room for every sandbox Pod at once (the smallest region's nodes hold 64 Pods each).
        bench = Bench(Path(tmp), nodes=30 if args.short else 90)
        try:
            bench.setup()
            agent_port = bench.start_agent()
            bench.add_sandboxes(burst_size + SEQUENTIAL, "burst")
            bench.add_sandboxes(cycle_count, "cycle")
            # Their own pool: which warm Pod a lease takes first is the gateway's business.
            bench.add_pool("exec")
            bench.add_sandboxes(exec_rounds, "exec", port=agent_port, pool="exec")
            bench.point_at_loopback([f"exec-{i:05d}" for i in range(exec_rounds)])
            url, pid = bench.start_gateway()
            log(f"{SEQUENTIAL} acquires one at a time")
            one_by_one = asyncio.run(sequential(url, SEQUENTIAL))
            log(f"burst of {burst_size} concurrent acquires")
            apiserver = bench.cluster.daemons()[1].pid()
            assert apiserver is not None
            # Three processes of the lean client: one httpx process spends more CPU than the gateway.
            cpu = CpuClock({"gateway": pid, "apiserver": apiserver})
            fired = rawhttp.burst([url], TOKEN, burst_size, run="burst", on_start=cpu.start, on_end=cpu.stop)
            latencies = fired["latencies"]
            cpu_per_lease = cpu.used["gateway"] / burst_size * 1000
            apiserver_cpu_per_lease = cpu.used["apiserver"] / burst_size * 1000
            log(f"{cycle_count} lease+release cycles, 32 at a time")
            rate = asyncio.run(cycles(url, cycle_count, 32))
            # The exec sandboxes carry the loopback agent (the others' addresses lead nowhere).
            log(f"{exec_rounds} x (lease -> first exec), 20 execs each")
            firsts, execs = asyncio.run(first_exec(url, exec_rounds))
        finally:
            bench.teardown()
    result = {
        "warm_lease_sequential_p50_ms": round(statistics.median(one_by_one), 2),
        "warm_lease_sequential_p99_ms": round(percentile(one_by_one, 99), 2),
        "warm_lease_burst_size": burst_size,
        "warm_lease_burst_p50_ms": round(statistics.median(latencies), 2),
        "warm_lease_burst_p99_ms": round(percentile(latencies, 99), 2),
        "lease_release_cycles_per_s": round(rate, 1),
        "first_exec_from_warm_lease_p50_ms": round(statistics.median(firsts), 2),
        "exec_true_via_gateway_p50_ms": round(statistics.median(execs), 2),
        "exec_true_via_gateway_p99_ms": round(percentile(execs, 99), 2),
        "gateway_cpu_ms_per_lease": round(cpu_per_lease, 3),
        "apiserver_cpu_ms_per_lease": round(apiserver_cpu_per_lease, 3),
        "load_generator_cpu_ms_per_lease": round(fired["client_cpu_s"] / burst_size * 1000, 3),
        "agent": "host process on loopback (not gVisor)",
        # Raw distributions (ms, sorted, thinned) for the report's plots.
        "samples_ms": {
            "warm lease, one at a time": thin(one_by_one),
            f"warm lease in a {burst_size} burst": thin(latencies),
            "first exec from a warm lease": thin(firsts),
            "exec true via the gateway": thin(execs),
        },
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
