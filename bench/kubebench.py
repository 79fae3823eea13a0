"""Plumbing for the operator benchmarks: a cluster (shared or separate), kubectl, the operator process."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localbench import free_port

from sandfleet.core import api
from sandfleet.core.ledger import ledger_from_object, overlay
from sandfleet.core.pods import sandbox_from_pod

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "hack" / "cluster"
SANDFLEET = REPO / ".venv" / "bin" / "sandfleet"
IMAGE = "sandfleet/sandbox:0.1.0"

# A second cluster for runs that change the node count: its own state directory and ports, so the
# shared test cluster is never touched.
BENCH_CLUSTER_ENV = {
    "SANDFLEET_CLUSTER_DIR": "/tmp/sandfleet-bench",
    "SANDFLEET_APISERVER_PORT": "26443",
    "SANDFLEET_ETCD_PORT": "33790",
    "SANDFLEET_ETCD_PEER_PORT": "33800",
    "SANDFLEET_CONTROLLER_MANAGER_PORT": "20257",
    "SANDFLEET_SCHEDULER_PORT": "20259",
    "SANDFLEET_KWOK_PORT": "20247",
}

# The scale run's own cluster (300 nodes, 10,000 Pods): another directory and other ports again, so it
# can run beside pool_fill's or the gateway benchmark's. All below 32768, out of the ephemeral range
# that free_port() and every outgoing connection draw from.
SCALE_CLUSTER_ENV = {
    "SANDFLEET_CLUSTER_DIR": "/tmp/sandfleet-bench-scale",
    "SANDFLEET_APISERVER_PORT": "27443",
    "SANDFLEET_ETCD_PORT": "27379",
    "SANDFLEET_ETCD_PEER_PORT": "27380",
    "SANDFLEET_CONTROLLER_MANAGER_PORT": "27257",
    "SANDFLEET_SCHEDULER_PORT": "27259",
    "SANDFLEET_KWOK_PORT": "27247",
}


def log(name: str, message: str) -> None:
    print(f"[bench {name}] {message}", file=sys.stderr, flush=True)


@dataclass
class Cluster:
    """A local cluster: the shared one (reused, never resized) or a separate one (made, then removed)."""

    separate: bool
    nodes: int = 12
    separate_env: dict[str, str] = field(default_factory=lambda: dict(BENCH_CLUSTER_ENV))
    env: dict[str, str] = field(default_factory=dict)
    kubeconfig: Path = Path()
    kubectl_bin: Path = Path()

    def __post_init__(self) -> None:
        self.env = {**os.environ, **(self.separate_env if self.separate else {})}

    def _hack(self, *args: str, timeout: float = 3600) -> str:
        result = subprocess.run(
            [str(CLUSTER), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if result.returncode != 0:
            raise SystemExit(f"hack/cluster {' '.join(args)} failed:\n{result.stderr[-3000:]}")
        return result.stdout.strip()

    def up(self) -> None:
        if self.separate:
            self._hack("up", "--nodes", str(self.nodes), "--gpu-nodes", "0")
        else:
            self._hack("up")
        self.kubeconfig = Path(self._hack("kubeconfig"))
        self.kubectl_bin = Path(self._hack("bin-dir")) / "kubectl"
        self.install()

    def install(self) -> None:
        """What every benchmark's cluster needs: sandfleet's CRDs (established), the gvisor RuntimeClass."""
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "manifests" / "crds"))
        self.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        self.apply(
            {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": "gvisor"},
                "handler": "runsc",
            }
        )

    def cleanup(self, namespace: str) -> None:
        """Remove what the run made: the whole separate cluster, or the namespace on the shared one."""
        if self.separate:
            self._hack("down")
            return
        if namespace:
            self.kubectl("delete", "namespace", namespace, "--wait=false")
            # The shared cluster's Pod slots are everyone's: hand them back before returning.
            wait(lambda: self.count_pods(namespace) == 0, 180, f"the Pods of {namespace} to go", interval=1.0)

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 300) -> str:
        result = subprocess.run(
            [str(self.kubectl_bin), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def apply(self, manifest: dict[str, Any], namespace: str | None = None) -> None:
        ns = [f"--namespace={namespace}"] if namespace else []
        self.kubectl(*ns, "apply", "-f", "-", stdin=json.dumps(manifest))

    def namespace(self, prefix: str) -> str:
        """A new namespace named `prefix`-<random>, ready for Pods."""
        return self.create_namespace(f"{prefix}-{uuid.uuid4().hex[:8]}")

    def create_namespace(self, name: str) -> str:
        """Namespace `name`, ready for Pods (its default ServiceAccount made)."""
        self.kubectl("create", "namespace", name)
        wait(
            lambda: bool(self.kubectl("-n", name, "get", "serviceaccount", "-o", "name").strip()),
            60,
            "the default ServiceAccount",
        )
        return name

    def count_pods(self, namespace: str) -> int:
        return len(self.kubectl("-n", namespace, "get", "pods", "-o", "name").split())


def wait(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.25) -> float:
    """Poll until `condition` holds; returns when it did (monotonic seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(interval)
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")


def _agent_key_file(directory: Path) -> Path:
    """A fleet key for the operator (sandbox agents' tokens derive from it), one per directory."""
    path = directory / "agent-key"
    if not path.exists():
        path.write_text(secrets.token_hex(32) + "\n")
    return path


@dataclass
class Operator:
    """`sandfleet operator -n <namespace>` as a subprocess."""

    cluster: Cluster
    namespace: str
    log_path: Path
    metrics_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**self.cluster.env, "KUBECONFIG": str(self.cluster.kubeconfig)}
        with self.log_path.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    str(SANDFLEET),
                    "operator",
                    "-n",
                    self.namespace,
                    "--metrics-port",
                    str(self.metrics_port),
                    "--leader-lease-seconds",
                    "5",
                    "--agent-key-file",
                    str(_agent_key_file(self.log_path.parent)),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
            )
        wait(
            lambda: "acquired leadership" in self.log_path.read_text(errors="replace"),
            60,
            "the operator to take the leader lease",
        )

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.pid)

    def memory_mb(self) -> tuple[float, float]:
        """(RSS now, peak RSS) in MiB."""
        values = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024
        return values["VmRSS"], values["VmHWM"]


def pool_manifest(
    name: str, replicas: int, regions: Sequence[str] = ("us-east1", "europe-west4", "asia-southeast1")
) -> dict[str, Any]:
    return {
        "apiVersion": "sandfleet.dev/v1alpha1",
        "kind": "SandboxPool",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "regions": [{"name": r, "maxSandboxes": 100000} for r in regions],
            "template": {"image": IMAGE, "imagePullPolicy": "Never", "readinessDeadlineSeconds": 600},
        },
    }


def lease_states(cluster: Cluster, namespace: str) -> Counter[str]:
    """How many sandbox Pods of the namespace are in each lease state, as the cluster records it.

    A Pod of the `pod` store carries its state itself; a ledger Pod's is its entry in its shard's
    SandboxLedger (read with the product's own readers, core.pods and core.ledger).
    """
    pods = json.loads(cluster.kubectl("-n", namespace, "get", "pods", "-l", api.POOL_LABEL, "-o", "json"))
    ledgers = json.loads(cluster.kubectl("-n", namespace, "get", api.LEDGER_PLURAL, "-o", "json"))
    entries = {}
    for obj in ledgers["items"]:
        ledger = ledger_from_object(obj)
        entries[ledger.shard] = ledger.entries
    states: Counter[str] = Counter()
    for pod in pods["items"]:
        sandbox = sandbox_from_pod(pod)
        if sandbox is None:
            continue
        if sandbox.shard is not None:
            sandbox = overlay(sandbox, entries.get(sandbox.shard, {}).get(sandbox.name))
        states[sandbox.state] += 1
    return states


def pool_ready(cluster: Cluster, namespace: str, name: str) -> int:
    out = cluster.kubectl("-n", namespace, "get", "sandboxpool", name, "-o", "jsonpath={.status.ready}")
    return int(out or 0)


RequestCounts = dict[tuple[str, str], float]
WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION")


def apiserver_requests(cluster: Cluster) -> tuple[RequestCounts, RequestCounts]:
    """The apiserver's own counters: (requests served by (verb, resource), open long-running by the same).

    Read from its /metrics with the admin client certificate (the kubeconfig's), so the numbers are
    the apiserver's, not what a client believes it sent. Non-resource URLs (/metrics, /healthz) are
    left out; this read itself is one of them. A write that failed is counted apart, its response
    code after the resource ("DELETE pods 409"): it cost the apiserver a request all the same.
    """
    from prometheus_client.parser import text_string_to_metric_families

    served: RequestCounts = {}
    open_now: RequestCounts = {}
    for family in text_string_to_metric_families(cluster.kubectl("get", "--raw", "/metrics")):
        if family.name not in ("apiserver_request", "apiserver_longrunning_requests"):
            continue
        for sample in family.samples:
            if sample.name not in ("apiserver_request_total", "apiserver_longrunning_requests"):
                continue
            resource = sample.labels.get("resource", "")
            if not resource:
                continue
            if sample.labels.get("subresource"):
                resource = f"{resource}/{sample.labels['subresource']}"
            verb, code = sample.labels.get("verb", "?"), sample.labels.get("code", "")
            if verb in WRITE_VERBS and code and not code.startswith("2"):
                resource = f"{resource} {code}"
            key = (verb, resource)
            into = served if sample.name == "apiserver_request_total" else open_now
            into[key] = into.get(key, 0.0) + sample.value
    return served, open_now


def request_delta(before: RequestCounts, after: RequestCounts) -> dict[str, int]:
    """Requests served between two reads, as {"VERB resource": count}, busiest first, zeros left out."""
    delta = {
        f"{verb} {resource}": int(count - before.get((verb, resource), 0.0))
        for (verb, resource), count in after.items()
    }
    return dict(sorted(((k, v) for k, v in delta.items() if v > 0), key=lambda kv: -kv[1]))


@dataclass
class Gateway:
    """`sandfleet gateway -n <namespace>` with one static token, as a subprocess."""

    cluster: Cluster
    namespace: str
    workdir: Path
    token: str = "bench-token"
    max_waiting: int = 100_000
    # A fleet gateway's member clusters (name, kubeconfig); empty: the one cluster above.
    members: tuple[tuple[str, Path], ...] = ()
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "gateway.log"

    def start(self) -> None:
        import httpx

        tokens = self.workdir / "gateway-tokens"
        tokens.write_text(f"{self.token} bench\n")
        env = {**self.cluster.env, "KUBECONFIG": str(self.cluster.kubeconfig)}
        if self.members:
            del env["KUBECONFIG"]  # the members' own kubeconfigs only
        argv = [
            str(SANDFLEET), "gateway", "--host", "127.0.0.1", "--port", str(self.port),
            "--namespace", self.namespace, "--auth", "static", "--token-file", str(tokens),
            "--max-waiting", str(self.max_waiting),
            "--agent-key-file", str(_agent_key_file(self.workdir)),
            *(f"--member={name}={kubeconfig}" for name, kubeconfig in self.members),
        ]  # fmt: skip
        with self.log_path.open("wb") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)

        def ready() -> bool:
            try:
                return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait(ready, 120, "the gateway to be ready (its index synced)", interval=0.5)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds a process (all its threads, live and ended) has used, to the nanosecond.

    /proc/PID/stat counts in clock ticks (10 ms): a 100-lease burst that costs the apiserver one
    ledger patch reads 0 there. The kernel's process CPU clock for PID (clock id
    `~pid << 3 | CPUCLOCK_SCHED`, see clock_getcpuclockid(3)) reads the same total exactly.
    """
    return time.clock_gettime((~pid << 3) | 2)


def process_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]
