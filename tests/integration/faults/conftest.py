"""The fault suite's own cluster, fleet and load: faults there never disturb the shared test cluster.

- `fault_cluster` (session): a local cluster in /tmp/sandfleet-faults-cluster on ports of its own,
  whose kwok gives Pods loopback addresses (127.1.0.0/16) and leaves readiness to the loopback
  kubelet (kubelet.py), so no traffic ever goes to a fake address. Torn down at the end.
- `fleet` (session): one namespace with a pool, 2 operator and 2 gateway replicas as real
  `sandfleet` subprocesses, the loopback kubelet and the Pod recorder (truth.py).
- `steady` (per test): the fleet healthy again (replicas, nodes, pool at target) and a steady
  load running; `Run.finish()` stops the load and asserts the invariants over the test's window.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from localcluster import build
from localcluster.cluster import LocalCluster, Ports, Topology
from localcluster.processes import Daemon
from sandfleet.core import api
from sandfleet.core.model import SandboxPod
from tests.integration.faults.kubeapi import KubeApi
from tests.integration.faults.kubelet import LoopbackKubelet
from tests.integration.faults.load import Load
from tests.integration.faults.truth import PodRecorder
from tests.support.agent_key import fleet_key_file
from tests.support.invariants import check_history, warm_sandboxes
from tests.support.kube import Kubectl, wait_until
from tests.support.leases import recorded
from tests.support.servers import wait_until_ready

REPO = Path(__file__).resolve().parents[3]
SANDFLEET = REPO / ".venv" / "bin" / "sandfleet"
CRDS = REPO / "manifests" / "crds"

CLUSTER_DIR = Path("/tmp/sandfleet-faults-cluster")
# Clear of the shared cluster (16443...), bench/gateway_leases.py (17443...), the life-cycle test and
# the benchmarks (2x443...), and below the ephemeral range.
PORTS = Ports(
    apiserver=18443, etcd_client=25790, etcd_peer=25800, controller_manager=12257, scheduler=12259, kwok=12247
)
CLUSTER_ENV = {
    "SANDFLEET_CLUSTER_DIR": str(CLUSTER_DIR),
    "SANDFLEET_APISERVER_PORT": str(PORTS.apiserver),
    "SANDFLEET_ETCD_PORT": str(PORTS.etcd_client),
    "SANDFLEET_ETCD_PEER_PORT": str(PORTS.etcd_peer),
    "SANDFLEET_CONTROLLER_MANAGER_PORT": str(PORTS.controller_manager),
    "SANDFLEET_SCHEDULER_PORT": str(PORTS.scheduler),
    "SANDFLEET_KWOK_PORT": str(PORTS.kwok),
}
# 2 nodes per zone: deleting one node never empties a zone (a new sandbox pinned to an empty zone
# would wait out its whole readiness deadline, Pending).
TOPOLOGY = Topology(nodes=12, gpu_nodes=0)
POD_CIDR = "127.1.0.0/16"  # loopback: every sandbox address is a local agent, never a fake IP
AGENT_PORT = 28080  # below the ephemeral range, so no outgoing connection ever holds it
POOL = "python"
TARGET = 6
TOKEN = "actor-token"
LEASE_TTL = 10  # the load's leases; an episode takes about a second
REAP_SECONDS = 12.0  # the operator's 2 s tick plus slack for 2 busy cores
REGIONS = ("us-east1", "europe-west4", "asia-southeast1")
NOT_READY_LABEL = "node-not-ready.stage.kwok.x-k8s.io"  # kwok's chaos stage: the node reports Ready=False


# -- the cluster ------------------------------------------------------------------------------------


@dataclass
class FaultCluster:
    """The fault suite's cluster: admin kubectl, a raw API client, and its daemons."""

    local: LocalCluster
    kubectl: Kubectl
    api: KubeApi

    def daemon(self, name: str) -> Daemon:
        return next(d for d in self.local.daemons() if d.name == name)

    def apiserver_ready(self) -> bool:
        try:
            return self.api.http.get("/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def ready_nodes(self) -> set[str]:
        nodes = self.kubectl.json("get", "nodes")["items"]
        return {
            n["metadata"]["name"]
            for n in nodes
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n.get("status", {}).get("conditions", [])
            )
            and not any(
                t.get("key", "").startswith("node.kubernetes.io/") for t in n["spec"].get("taints", [])
            )
        }


def _hack_cluster(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **CLUSTER_ENV}
    return subprocess.run(
        [str(REPO / "hack" / "cluster"), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def _not_ready_until_probed(template: str) -> str:
    """kwok's pod-ready status, but Ready=False: readiness is the loopback kubelet's to report."""
    head, marker, tail = template.partition("initContainerStatuses:")
    changed, count = re.subn(
        r'status: "True"\n(\s*)type: (Ready|ContainersReady)\b', r'status: "False"\n\1type: \2', head
    )
    changed, ready_flags = re.subn(r"\bready: true\b", "ready: false", changed)
    if count != 2 or ready_flags != 1 or not marker:
        raise AssertionError(f"kwok's pod-ready stage changed shape; cannot defer readiness:\n{template}")
    return changed + marker + tail


def _is_loopback(local: LocalCluster) -> bool:
    pid = next(d for d in local.daemons() if d.name == "kwok").pid()
    if pid is None:
        return False
    return f"--cidr={POD_CIDR}".encode() in Path(f"/proc/{pid}/cmdline").read_bytes()


def _loopback_kwok(local: LocalCluster, kubectl: Kubectl) -> None:
    """Restart kwok with loopback Pod addresses and readiness left to the loopback kubelet."""
    config = local.state_dir / "kwok.yaml"
    stages = list(yaml.safe_load_all(config.read_text()))
    for stage in stages:
        if stage["metadata"]["name"] == "pod-ready":
            stage["spec"]["next"]["statusTemplate"] = _not_ready_until_probed(
                stage["spec"]["next"]["statusTemplate"]
            )
    config.write_text(yaml.safe_dump_all(stages, sort_keys=False))
    kwok = next(d for d in local.daemons() if d.name == "kwok")
    argv = tuple(f"--cidr={POD_CIDR}" if a.startswith("--cidr=") else a for a in kwok.argv)
    kwok.stop()
    # A new kwok waits out the old one's node Leases (40 s) before it takes the nodes over.
    kubectl("delete", "lease", "--all", "-n", "kube-node-lease")
    Daemon("kwok", argv, local.state_dir).start()


def _heal_nodes(local: LocalCluster, kubectl: Kubectl) -> None:
    """Every simulated node back and reporting Ready (faults delete nodes and make them NotReady)."""
    nodes = kubectl.json("get", "nodes")["items"]
    for node in nodes:
        if NOT_READY_LABEL in node["metadata"].get("labels", {}):
            kubectl("label", "node", node["metadata"]["name"], f"{NOT_READY_LABEL}-")
    if len(nodes) < TOPOLOGY.nodes:
        local.reconcile_nodes(TOPOLOGY)


@pytest.fixture(scope="session")
def fault_cluster() -> Iterator[FaultCluster]:
    """A fresh cluster for the fault suite, torn down (`hack/cluster down`) at the end.

    SANDFLEET_FAULTS_REUSE_CLUSTER=1 keeps a healthy one between runs (for iterating on the suite).
    """
    local = LocalCluster(CLUSTER_DIR, PORTS)
    reuse = os.environ.get("SANDFLEET_FAULTS_REUSE_CLUSTER") == "1"
    if not (reuse and local.is_up()):
        _hack_cluster("down", timeout=120)
        up = _hack_cluster("up", "--nodes", str(TOPOLOGY.nodes), "--gpu-nodes", "0", timeout=3600)
        if up.returncode != 0:
            pytest.fail(f"the fault cluster did not start (hack/cluster up):\n{up.stderr[-4000:]}")
    kubectl = Kubectl(build.binary("kubectl"), local.kubeconfig)
    kube_api = KubeApi(local.server_url, local.pki.directory)
    try:
        if not _is_loopback(local):
            _loopback_kwok(local, kubectl)
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS))
        kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        kubectl.apply(
            {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": "gvisor"},
                "handler": "runsc",
            }
        )
        _heal_nodes(local, kubectl)
        cluster = FaultCluster(local, kubectl, kube_api)
        wait_until(lambda: len(cluster.ready_nodes()) == TOPOLOGY.nodes, 120, "the fault cluster's nodes", 1)
        yield cluster
    finally:
        kube_api.close()
        if not reuse:
            down = _hack_cluster("down", timeout=300)
            assert down.returncode == 0, down.stderr


# -- the fleet --------------------------------------------------------------------------------------


@dataclass
class Replica:
    """One `sandfleet operator` or `sandfleet gateway` process (restarted as a Deployment would)."""

    name: str
    argv: list[str]
    log: Path
    port: int
    process: subprocess.Popen[bytes] | None = None
    kills: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, env: dict[str, str]) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO
            )

    def kill9(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)
        self.kills += 1

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def _port_of(index: int) -> int:
    # Fixed per replica, so a restarted replica answers where its Service endpoint was.
    return 18090 + index


@dataclass
class Fleet:
    """The pool, its operators and gateways, the loopback kubelet and the recorder, in one namespace."""

    cluster: FaultCluster
    namespace: str
    workdir: Path
    operators: list[Replica] = field(default_factory=list)
    gateways: list[Replica] = field(default_factory=list)
    kubelet: LoopbackKubelet | None = None
    recorder: PodRecorder | None = None

    @property
    def kube(self) -> Kubectl:
        return self.cluster.kubectl.in_namespace(self.namespace)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.cluster.local.kubeconfig)}

    @property
    def urls(self) -> list[str]:
        return [g.url for g in self.gateways]

    def add_replicas(self) -> None:
        tokens = self.workdir / "tokens"
        tokens.write_text(f"{TOKEN} actor-0 {POOL}\n")
        for index in range(2):
            metrics = _port_of(10 + index)
            self.operators.append(
                Replica(
                    f"operator-{index}",
                    [
                        str(SANDFLEET),
                        "operator",
                        "-n",
                        self.namespace,
                        "--metrics-port",
                        str(metrics),
                        "--leader-lease-seconds",
                        "3",
                        "--agent-key-file",
                        str(fleet_key_file(self.workdir)),
                    ],
                    self.workdir / f"operator-{index}.log",
                    metrics,
                )
            )
            port = _port_of(index)
            self.gateways.append(
                Replica(
                    f"gateway-{index}",
                    [
                        str(SANDFLEET),
                        "gateway",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "-n",
                        self.namespace,
                        "--auth",
                        "static",
                        "--token-file",
                        str(tokens),
                        "--max-waiting",
                        "200",
                        "--agent-key-file",
                        str(fleet_key_file(self.workdir)),
                    ],
                    self.workdir / f"gateway-{index}.log",
                    port,
                )
            )

    def ensure_replicas(self) -> None:
        """Start every replica that is not running (a Deployment would), and wait for the gateways."""
        for replica in [*self.operators, *self.gateways]:
            if not replica.alive:
                replica.start(self.env)
        for gateway in self.gateways:
            assert gateway.process is not None
            wait_until_ready(gateway.url, gateway.process, gateway.log, 60, f"{gateway.name} to be ready")

    def leader(self) -> Replica:
        holder = self.kube.json("get", "lease", "sandfleet-operator")["spec"].get("holderIdentity") or ""
        for replica in self.operators:
            if replica.alive and replica.process and f"-{replica.process.pid}-" in holder:
                return replica
        raise AssertionError(f"no running operator holds the leader Lease (holder {holder!r})")

    def pods(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.kube.json("get", "pods", "-l", api.POOL_LABEL)["items"]
        return items

    def ledgers(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.kube.json("get", api.LEDGER_PLURAL)["items"]
        return items

    def recorded(self) -> dict[str, SandboxPod]:
        """Pod name -> each sandbox with its lease state as the cluster records it (Pod or ledger)."""
        return recorded(self.pods(), self.ledgers())

    def warm(self) -> dict[str, int]:
        return warm_sandboxes(self.pods(), self.cluster.ready_nodes(), self.ledgers())

    def surplus(self) -> list[str]:
        """Live Pods beyond the warm target that are not leased (starting, released, free extra)."""
        states = [s.state for s in self.recorded().values() if not s.terminating]
        return [s or "?" for s in states if s != api.LEASE_LEASED][TARGET:]

    def wait_at_target(self, timeout: float = 90) -> None:
        def at_target() -> bool:
            return sum(self.warm().values()) == TARGET and not self.surplus()

        try:
            wait_until(at_target, timeout, f"the pool back at its target of {TARGET} warm sandboxes", 0.5)
        except AssertionError as error:
            leader_log = "\n".join(f"--- {o.name}\n{o.log_tail()}" for o in self.operators)
            state = f"warm {self.warm()}, surplus {self.surplus()}\npods:\n{self.describe()}"
            raise AssertionError(f"{error}: {state}\n{leader_log}") from None

    def describe(self) -> str:
        """One line per sandbox Pod: what a failed wait needs to explain itself."""
        lines = []
        recorded = self.recorded()
        for pod in self.pods():
            meta, status = pod["metadata"], pod.get("status", {})
            ready = [c["status"] for c in status.get("conditions", []) if c["type"] == "Ready"]
            known = recorded.get(meta["name"])
            state = known.state if known is not None else "?"
            lines.append(
                f"{meta['name']} {state} {status.get('phase')} ready={ready} "
                f"ip={status.get('podIP')} node={pod['spec'].get('nodeName')} "
                f"deleting={bool(meta.get('deletionTimestamp'))} created={meta['creationTimestamp']}"
            )
        return "\n".join(lines)

    def wait_quiet(self, timeout: float = 60) -> None:
        """Until no Pod is leased or released any more: every lease ended and was reaped."""

        def quiet() -> bool:
            return all(s.state == api.LEASE_FREE for s in self.recorded().values())

        wait_until(quiet, timeout, "every lease to end and its Pod to be reaped", 0.5)

    def restore(self) -> None:
        """Healthy again: every replica, every node Ready, the pool at its target."""
        self.ensure_replicas()
        _heal_nodes(self.cluster.local, self.cluster.kubectl)
        assert self.kubelet is not None
        for node in list(self.kubelet.lost_nodes):
            self.kubelet.restore_node(node)
        wait_until(lambda: len(self.cluster.ready_nodes()) == TOPOLOGY.nodes, 120, "every node Ready", 1)
        self.wait_quiet()
        self.wait_at_target()


@pytest.fixture(scope="session")
def fleet(fault_cluster: FaultCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    namespace = f"faults-{uuid.uuid4().hex[:6]}"
    kubectl = fault_cluster.kubectl
    kubectl("create", "namespace", namespace)
    wait_until(
        lambda: kubectl.run("-n", namespace, "get", "serviceaccount", "default").returncode == 0,
        60,
        "the namespace's default ServiceAccount",
    )
    workdir = tmp_path_factory.mktemp("faults")
    fleet = Fleet(fault_cluster, namespace, workdir)
    fleet.kube.apply(
        {
            "apiVersion": api.API_VERSION,
            "kind": api.POOL_KIND,
            "metadata": {"name": POOL},
            "spec": {
                "replicas": TARGET,
                "regions": [{"name": r} for r in REGIONS],
                "template": {
                    "image": "sandfleet/sandbox:0.1.0",
                    "imagePullPolicy": "Never",
                    "agentPort": AGENT_PORT,
                },
                "lease": {"defaultTTLSeconds": LEASE_TTL, "maxTTLSeconds": 60},
            },
        }
    )
    fleet.recorder = PodRecorder(fault_cluster.api, namespace)
    fleet.kubelet = LoopbackKubelet(fault_cluster.api, namespace, workdir / "agents")
    fleet.recorder.start()
    fleet.kubelet.start()
    fleet.add_replicas()
    try:
        fleet.ensure_replicas()
        fleet.wait_at_target(120)
        yield fleet
    finally:
        for replica in [*fleet.gateways, *fleet.operators]:
            replica.stop()
        fleet.kubelet.stop()
        fleet.recorder.stop()
        kubectl("delete", "namespace", namespace, "--wait=false")


# -- one test's run ---------------------------------------------------------------------------------


@dataclass
class Run:
    """One fault test: the fleet, the steady load on it, and the invariants at the end."""

    fleet: Fleet
    load: Load
    started: float
    outages: list[tuple[float, float]] = field(default_factory=list)  # apiserver down (wall clock)
    stopped: bool = False

    def mark(self, what: str) -> None:
        print(f"[{time.time() - self.started:6.1f}s] {what}", flush=True)

    def finish(self, hang_seconds: float = 15.0) -> dict[str, Any]:
        """Stop the load, let every lease end and be reaped, check every invariant; a summary."""
        self.mark("fault over: stopping the load")
        self.load.stop()
        self.stopped = True
        fleet = self.fleet
        fleet.wait_quiet(LEASE_TTL + REAP_SECONDS + 30)
        fleet.wait_at_target()
        self.mark("every lease ended and reaped, the pool at its target")
        assert fleet.recorder is not None
        assert fleet.kubelet is not None
        time.sleep(1.0)  # the recorder's watch catches up with the last deletions
        pods = fleet.recorder.snapshot(since=self.started)
        losses = [loss for loss in fleet.kubelet.losses if loss.at >= self.started]
        violations = check_history(
            self.load.leases,
            pods,
            losses,
            now=time.time(),
            reap_seconds=REAP_SECONDS,
            gaps=fleet.recorder.gaps_since(self.started),
            hang_seconds=hang_seconds,
            outages=self.outages,
        )
        violations += self.load.stats.anomalies
        summary = {
            "seconds": round(time.time() - self.started, 1),
            "episodes": self.load.stats.episodes,
            "leases": len(self.load.leases),
            "losses": len(losses),
            "lease_errors": sum(1 for lease in self.load.leases if lease.first_lease_error),
            "failed_acquires": sum(1 for call in self.load.stats.acquires if not call.ok),
            "pods_seen": len(pods),
        }
        print(f"fault run summary: {json.dumps(summary)}")
        assert not violations, "invariants broken:\n" + "\n".join(violations[:40])
        assert self.load.stats.episodes > 0, "the load never completed an episode"
        return summary


@pytest.fixture
def steady(fleet: Fleet) -> Iterator[Run]:
    """A healthy fleet under a steady load of 3 workers; the test ends with `run.finish()`."""
    fleet.restore()
    started = time.time()
    load = Load(fleet.urls, TOKEN, POOL, workers=3, ttl_seconds=LEASE_TTL)
    load.start()
    run = Run(fleet, load, started)
    yield run
    if not run.stopped:
        load.stop()
