"""Brings the local cluster up and down: etcd, kube-apiserver, controller-manager, scheduler and kwok."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from localcluster import build, nodes
from localcluster.paths import STATE_DIR
from localcluster.pki import Pki, generate
from localcluster.processes import Daemon

SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"  # handed to kwok for fake pod IPs; nothing is ever routed there


def _port(name: str, default: int) -> int:
    return int(os.environ.get(f"SANDFLEET_{name}_PORT", default))


@dataclass(frozen=True)
class Ports:
    """Loopback ports the cluster listens on; each can be moved (SANDFLEET_<NAME>_PORT) to run two."""

    apiserver: int = _port("APISERVER", 16443)
    etcd_client: int = _port("ETCD", 23790)
    etcd_peer: int = _port("ETCD_PEER", 23800)
    controller_manager: int = _port("CONTROLLER_MANAGER", 10257)
    scheduler: int = _port("SCHEDULER", 10259)
    kwok: int = _port("KWOK", 10247)


@dataclass(frozen=True)
class Topology:
    """How many simulated nodes to keep."""

    nodes: int = 18  # 3 per zone: room for ~1,700 pods, so suites and short benchmarks fit together
    gpu_nodes: int = 2

    def __post_init__(self) -> None:
        nodes.simulated_nodes(self.nodes, self.gpu_nodes)  # raises ValueError with the flag to fix


def _log(message: str) -> None:
    print(f"[hack/cluster] {message}", file=sys.stderr, flush=True)


class LocalCluster:
    """One local cluster rooted at a state directory."""

    def __init__(self, state_dir: Path = STATE_DIR, ports: Ports | None = None) -> None:
        self.state_dir = state_dir
        self.ports = ports or Ports()
        self.pki = Pki(state_dir / "pki")

    @property
    def server_url(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def kubeconfig(self) -> Path:
        return self.pki.kubeconfig("admin")

    @property
    def etcd_data(self) -> Path:
        return self.state_dir / "etcd"

    def daemons(self) -> list[Daemon]:
        """Every component in start order (stopped in reverse)."""
        kube = {name: build.binary(name) for name in build.KUBE_COMMANDS}
        etcd = build.binary("etcd")
        kwok = build.binary("kwok")
        p, pki, ports = self.state_dir, self.pki, self.ports
        etcd_url = f"http://127.0.0.1:{ports.etcd_client}"
        return [
            Daemon(
                "etcd",
                (
                    str(etcd),
                    "--name=sandfleet-local",
                    f"--data-dir={self.etcd_data}",
                    f"--listen-client-urls={etcd_url}",
                    f"--advertise-client-urls={etcd_url}",
                    f"--listen-peer-urls=http://127.0.0.1:{ports.etcd_peer}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{ports.etcd_peer}",
                    f"--initial-cluster=sandfleet-local=http://127.0.0.1:{ports.etcd_peer}",
                    # A throwaway test cluster: durability across power loss buys nothing here.
                    "--unsafe-no-fsync",
                    "--quota-backend-bytes=8589934592",
                    "--log-level=warn",
                ),
                p,
            ),
            Daemon(
                "kube-apiserver",
                (
                    str(kube["kube-apiserver"]),
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    f"--secure-port={ports.apiserver}",
                    f"--etcd-servers={etcd_url}",
                    f"--tls-cert-file={pki.serving_cert}",
                    f"--tls-private-key-file={pki.serving_key}",
                    f"--client-ca-file={pki.ca_cert}",
                    f"--service-account-key-file={pki.service_account_pub}",
                    f"--service-account-signing-key-file={pki.service_account_key}",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    f"--kubelet-client-certificate={pki.client_cert('apiserver-kubelet-client')}",
                    f"--kubelet-client-key={pki.client_key('apiserver-kubelet-client')}",
                    "--authorization-mode=Node,RBAC",
                    # On top of the default plugins, as kubeadm and managed clusters enable it.
                    "--enable-admission-plugins=NodeRestriction",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--allow-privileged=true",
                    # Room for the benchmarks' bursts (defaults are 400/200).
                    "--max-requests-inflight=1600",
                    "--max-mutating-requests-inflight=800",
                    "--profiling=false",
                    "--v=1",
                ),
                p,
            ),
            Daemon(
                "kube-controller-manager",
                (
                    str(kube["kube-controller-manager"]),
                    f"--kubeconfig={pki.kubeconfig('controller-manager')}",
                    f"--authentication-kubeconfig={pki.kubeconfig('controller-manager')}",
                    f"--authorization-kubeconfig={pki.kubeconfig('controller-manager')}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={ports.controller_manager}",
                    f"--service-account-private-key-file={pki.service_account_key}",
                    f"--root-ca-file={pki.ca_cert}",
                    f"--cluster-signing-cert-file={pki.ca_cert}",
                    f"--cluster-signing-key-file={pki.ca_key}",
                    "--use-service-account-credentials=true",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--leader-elect=false",
                    "--kube-api-qps=500",
                    "--kube-api-burst=1000",
                    "--concurrent-replicaset-syncs=10",
                    "--concurrent-deployment-syncs=10",
                    "--v=1",
                ),
                p,
            ),
            Daemon(
                "kube-scheduler",
                (
                    str(kube["kube-scheduler"]),
                    f"--config={self.state_dir / 'scheduler.yaml'}",
                    f"--authentication-kubeconfig={pki.kubeconfig('scheduler')}",
                    f"--authorization-kubeconfig={pki.kubeconfig('scheduler')}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={ports.scheduler}",
                    "--v=1",
                ),
                p,
            ),
            Daemon(
                "kwok",
                (
                    str(kwok),
                    f"--kubeconfig={pki.kubeconfig('kwok')}",
                    f"--config={self.state_dir / 'kwok.yaml'}",
                    # Only nodes we annotate: a real kubelet node must stay untouched.
                    "--manage-all-nodes=false",
                    f"--manage-nodes-with-annotation-selector={nodes.KWOK_ANNOTATION}=fake",
                    f"--cidr={POD_CIDR}",
                    # Renew each node's Lease: without it the node-lifecycle controller sees no
                    # heartbeat for 40s, marks the node Unknown and every Pod on it NotReady for good.
                    "--node-lease-duration-seconds=40",
                    "--node-ip=127.0.0.1",
                    f"--server-address=127.0.0.1:{ports.kwok}",
                ),
                p,
            ),
        ]

    # -- lifecycle ------------------------------------------------------------------------------

    def running(self) -> dict[str, int | None]:
        return {d.name: d.pid() for d in self.daemons()}

    def is_up(self) -> bool:
        return all(self.running().values()) and self._apiserver_ready()

    def up(self, topology: Topology) -> None:
        """Start the cluster (or reuse a healthy one) and reconcile its simulated nodes."""
        started = time.monotonic()
        build.build_all()
        if self.is_up():
            _log(f"reusing the running cluster at {self.server_url}")
        else:
            if self.state_dir.exists():
                _log("found a stopped or partial cluster: cleaning it up first")
                self.down(quiet=True)
            self._start()
        self.reconcile_nodes(topology)
        self._wait_for_service_accounts()
        self._write_info(topology)
        _log(f"cluster ready in {time.monotonic() - started:.1f}s; KUBECONFIG={self.kubeconfig}")

    def _start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        generate(self.pki, self.server_url)
        self._write_configs()
        etcd, apiserver, *rest = self.daemons()
        etcd.start()
        self._wait("etcd", etcd, self._etcd_healthy, 30)
        apiserver.start()
        self._wait("kube-apiserver", apiserver, self._apiserver_ready, 60)
        for daemon in rest:
            daemon.start()
        for daemon in rest:
            self._wait(daemon.name, daemon, lambda: True, 1)

    def _wait(self, what: str, daemon: Daemon, ready: object, timeout: float) -> None:
        assert callable(ready)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if daemon.pid() is None:
                raise SystemExit(f"{what} exited while starting; its log:\n{daemon.log_tail()}")
            if ready():
                return
            time.sleep(0.2)
        raise SystemExit(f"{what} not ready after {timeout:.0f}s; its log:\n{daemon.log_tail()}")

    def _etcd_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.ports.etcd_client}/health", timeout=1
            ) as response:
                return bool(json.load(response).get("health") == "true")
        except OSError:
            return False

    def _apiserver_ready(self) -> bool:
        if not self.kubeconfig.exists():
            return False
        result = self.kubectl("get", "--raw=/readyz", check=False, timeout=5)
        return result.returncode == 0 and result.stdout.strip() == "ok"

    def down(self, quiet: bool = False) -> None:
        """Stop every daemon (reverse order) and remove all state; leaves no process or port."""
        for daemon in reversed(self.daemons()):
            if daemon.pid() is not None and not quiet:
                _log(f"stopping {daemon.name}")
            daemon.stop()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        if not quiet:
            _log("cluster stopped and its state removed")

    # -- configuration -------------------------------------------------------------------------

    def _write_configs(self) -> None:
        scheduler = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {
                "kubeconfig": str(self.pki.kubeconfig("scheduler")),
                "qps": 500,
                "burst": 1000,
            },
            "leaderElection": {"leaderElect": False},
        }
        (self.state_dir / "scheduler.yaml").write_text(yaml.safe_dump(scheduler))
        kwok_dir = build.binary("kwok").parent
        stages = [(kwok_dir / Path(stage).name).read_text().strip() for stage in build.KWOK_STAGES]
        (self.state_dir / "kwok.yaml").write_text("\n---\n".join(stages) + "\n")

    def reconcile_nodes(self, topology: Topology) -> None:
        """Create missing simulated nodes, drop extra ones, and wait until all report Ready."""
        wanted = nodes.simulated_nodes(topology.nodes, topology.gpu_nodes)
        names = {n["metadata"]["name"] for n in wanted}
        listed = self.kubectl("get", "nodes", "-l", f"{nodes.SIMULATED_LABEL}=true", "-o", "name", timeout=30)
        existing = {line.removeprefix("node/") for line in listed.stdout.split()}
        missing = [n for n in wanted if n["metadata"]["name"] not in existing]
        extra = sorted(existing - names)
        if missing:
            _log(f"creating {len(missing)} simulated nodes")
            manifest = {"apiVersion": "v1", "kind": "List", "items": missing}
            self.kubectl("create", "-f", "-", stdin=json.dumps(manifest), timeout=120)
        if extra:
            _log(f"deleting {len(extra)} simulated nodes beyond --nodes/--gpu-nodes")
            self.kubectl("delete", "node", "--wait=false", *extra, timeout=120)
        self.kubectl(
            "wait",
            "--for=condition=Ready",
            "node",
            "-l",
            f"{nodes.SIMULATED_LABEL}=true",
            "--timeout=120s",
            timeout=130,
        )

    def _wait_for_service_accounts(self) -> None:
        """Pods need the namespace's default ServiceAccount, which the controller-manager makes."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.kubectl("get", "serviceaccount", "default", check=False).returncode == 0:
                return
            time.sleep(0.3)
        cm = self.daemons()[2]
        raise SystemExit(f"no default ServiceAccount after 60s; controller-manager log:\n{cm.log_tail()}")

    def _write_info(self, topology: Topology) -> None:
        info = {
            "server": self.server_url,
            "kubeconfig": str(self.kubeconfig),
            "topology": asdict(topology),
            "versions": {b.name: b.version() for b in build.cluster_builds()},
        }
        (self.state_dir / "cluster.json").write_text(json.dumps(info, indent=2))

    # -- inspection ----------------------------------------------------------------------------

    def kubectl(
        self,
        *args: str,
        stdin: str | None = None,
        check: bool = True,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(build.binary("kubectl")), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def status(self) -> bool:
        """Print what runs and whether it is healthy; True when the whole cluster is up."""
        running = self.running()
        for name, pid in running.items():
            print(f"{name:<24} {'running (pid ' + str(pid) + ')' if pid else 'not running'}")
        ready = all(running.values()) and self._apiserver_ready()
        print(f"{'apiserver':<24} {self.server_url} {'ready' if ready else 'not ready'}")
        if ready:
            listed = self.kubectl(
                "get",
                "nodes",
                "-o",
                "jsonpath={range .items[*]}{.metadata.labels.topology\\.kubernetes\\.io/region}{'\\n'}{end}",
            )
            per_region: dict[str, int] = {}
            for region in listed.stdout.split():
                per_region[region] = per_region.get(region, 0) + 1
            summary = ", ".join(f"{r}={n}" for r, n in sorted(per_region.items()))
            print(f"{'nodes':<24} {summary}")
            print(f"{'kubeconfig':<24} {self.kubeconfig}")
        return ready
