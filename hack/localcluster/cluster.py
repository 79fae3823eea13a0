"""Brings the local cluster up and down: etcd, kube-apiserver, controller-manager, scheduler and kwok.

With `--real-node` it also runs one real node (containerd, kubelet, kube-proxy, kube-router; see
realnode.py) and the apiserver binds to that node's IP instead of loopback so pods can reach it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from localcluster import build, images, nodes, realnode
from localcluster.addresses import KUBERNETES_SERVICE_IP, NODE_IP, SERVICE_CIDR
from localcluster.addresses import KWOK_POD_CIDR as POD_CIDR
from localcluster.paths import STATE_DIR
from localcluster.pki import Pki, generate
from localcluster.processes import Daemon
from localcluster.realnode import RealNode, RealNodeSpec

__all__ = ["POD_CIDR", "SERVICE_CIDR", "LocalCluster", "Ports", "Topology"]


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


def ports_in_use(ports: Ports) -> list[str]:
    """The cluster's ports something already listens on, as the variable that moves each (empty: all free)."""
    busy = []
    for name, port in asdict(ports).items():
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                variable = "ETCD" if name == "etcd_client" else name.upper()
                busy.append(f"SANDFLEET_{variable}_PORT={port}")
    return busy


@dataclass(frozen=True)
class Topology:
    """How many simulated nodes to keep."""

    nodes: int = 18  # 3 per zone: room for ~1,700 pods, so suites and short benchmarks fit together
    gpu_nodes: int = 2
    real_node: RealNodeSpec | None = None

    def __post_init__(self) -> None:
        nodes.simulated_nodes(self.nodes, self.gpu_nodes)  # raises ValueError with the flag to fix


def _log(message: str) -> None:
    print(f"[hack/cluster] {message}", file=sys.stderr, flush=True)


class LocalCluster:
    """One local cluster rooted at a state directory."""

    def __init__(
        self, state_dir: Path = STATE_DIR, ports: Ports | None = None, pod_cidr: str = POD_CIDR
    ) -> None:
        self.state_dir = state_dir
        self.ports = ports or Ports()
        # Where kwok's Pod addresses come from: fake ones by default; a benchmark whose Pods must
        # answer (an agent on this host for every Pod) gives a loopback range such as 127.1.0.0/16.
        self.pod_cidr = pod_cidr
        self.pki = Pki(state_dir / "pki")
        # A cluster started with --real-node says so in its state directory; later commands follow it.
        self.real_node_spec = RealNodeSpec.load(self.real_node_file)

    @property
    def real_node_file(self) -> Path:
        return self.state_dir / "real-node.json"

    @property
    def real_node(self) -> RealNode | None:
        if self.real_node_spec is None:
            return None
        return RealNode(self.state_dir, self.real_node_spec, self.pki)

    @property
    def bind_address(self) -> str:
        """Loopback; the real node's IP with --real-node (pods reach the apiserver there)."""
        return NODE_IP if self.real_node_spec else "127.0.0.1"

    @property
    def server_url(self) -> str:
        return f"https://{self.bind_address}:{self.ports.apiserver}"

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
                    f"--bind-address={self.bind_address}",
                    f"--advertise-address={self.bind_address}",
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
                    # The real node's name resolves nowhere (no DNS here): reach its kubelet by IP.
                    *(["--kubelet-preferred-address-types=InternalIP"] if self.real_node_spec else []),
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
                    f"--cidr={self.pod_cidr}",
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
        running = {d.name: d.pid() for d in self.daemons()}
        node = self.real_node
        if node is not None:
            running.update(node.running())
        return running

    def is_up(self) -> bool:
        return all(self.running().values()) and self._apiserver_ready()

    def up(self, topology: Topology) -> None:
        """Start the cluster (or reuse a healthy one) and reconcile its simulated nodes."""
        started = time.monotonic()
        build.build_all()
        wanted = topology.real_node
        gvisor_bin = realnode.gvisor_bin_dir() if wanted else None
        if self.is_up():
            if wanted != self.real_node_spec:
                have = (
                    f"--real-node (region {self.real_node_spec.region})"
                    if self.real_node_spec
                    else "no real node"
                )
                raise SystemExit(
                    f"the running cluster in {self.state_dir} has {have}: "
                    "`hack/cluster down` first to change that"
                )
            _log(f"reusing the running cluster at {self.server_url}")
        else:
            if self.state_dir.exists() or _owns_node_link(self.state_dir):
                _log("found a stopped or partial cluster: cleaning it up first")
                self.down(quiet=True)
            self.real_node_spec = wanted
            self._start()
        if gvisor_bin is not None:
            self._start_real_node(gvisor_bin)
        self.reconcile_nodes(topology)
        self._wait_for_service_accounts()
        self._write_info(topology)
        _log(f"cluster ready in {time.monotonic() - started:.1f}s; KUBECONFIG={self.kubeconfig}")

    def _start(self) -> None:
        busy = ports_in_use(self.ports)
        if busy:
            # Another cluster's etcd on our port would answer our health check and take our
            # apiserver's writes: refuse, rather than start half a cluster on someone else's data.
            raise SystemExit(
                f"ports already in use by another process: {', '.join(busy)}; stop it, or move this "
                "cluster to free ports with those variables"
            )
        self.state_dir.mkdir(parents=True, exist_ok=True)
        node = self.real_node
        if node is None:
            generate(self.pki, self.server_url)
        else:
            assert self.real_node_spec is not None
            node.claim_host()
            # Saved once the host is ours: a `down` after a failure half-way cleans it up.
            self.real_node_spec.save(self.real_node_file)
            generate(
                self.pki,
                self.server_url,
                extra_ips=(NODE_IP, KUBERNETES_SERVICE_IP),
                extra_identities=realnode.identities(self.real_node_spec),
            )
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
        try:
            result = self.kubectl("get", "--raw=/readyz", check=False, timeout=5)
        except subprocess.TimeoutExpired:  # a loaded machine: not ready yet, ask again
            return False
        return result.returncode == 0 and result.stdout.strip() == "ok"

    def _start_real_node(self, gvisor_bin: Path) -> None:
        """Start containerd, import the pause, sandbox and agent bundle images, then the node's daemons."""
        node = self.real_node
        assert node is not None
        assert self.real_node_spec is not None
        started = time.monotonic()
        name = self.real_node_spec.name
        if all(node.running().values()) and self._node_ready(name):
            _log(f"reusing the running real node {name}")
            return
        pause_archive, pause_ref = images.pause_image()
        sandbox_archive = realnode.sandbox_image_archive()
        bundle_archive, bundle_ref = realnode.agent_bundle_image_archive()
        for daemon in reversed(node.daemons()):
            daemon.stop()
        node.write_configs(gvisor_bin, pause_ref)
        _log("starting containerd")
        node.start_runtime()
        node.import_image(pause_archive)
        node.import_image(sandbox_archive, realnode.SANDBOX_IMAGE_REF)
        node.import_image(bundle_archive, bundle_ref)
        self.kubectl(
            "apply",
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": realnode.KUBE_ROUTER_RBAC}),
        )
        _log(f"starting kubelet, kube-proxy and kube-router for node {name}")
        started_daemons = node.start("kubelet", "kube-proxy")
        deadline = time.monotonic() + 120
        while not self._node_ready(name):
            for daemon in started_daemons:
                if daemon.pid() is None:
                    raise SystemExit(f"{daemon.name} exited while starting; its log:\n{daemon.log_tail()}")
            if time.monotonic() > deadline:
                kubelet = node.daemons()[1]
                raise SystemExit(f"node {name} not Ready after 120s; kubelet log:\n{kubelet.log_tail(40)}")
            time.sleep(0.5)
        # Nothing allocates node CIDRs here (kwok's fake nodes need none); record the bridge's range
        # so kube-router and anything reading spec.podCIDR see the truth.
        self.kubectl(
            "patch",
            "node",
            name,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"podCIDR": realnode.POD_CIDR, "podCIDRs": [realnode.POD_CIDR]}}),
            check=False,
        )
        (router,) = node.start("kube-router")
        time.sleep(1)
        if router.pid() is None:
            raise SystemExit(f"kube-router exited while starting; its log:\n{router.log_tail()}")
        if self.kubectl("get", "runtimeclass", realnode.RUNTIME_CLASS, check=False).returncode != 0:
            self.kubectl("create", "-f", "-", stdin=json.dumps(realnode.RUNTIME_CLASS_MANIFEST), check=False)
        (node.root / "agent-bundle.ref").write_text(bundle_ref)
        for ref in (pause_ref, realnode.SANDBOX_IMAGE_REF, bundle_ref):
            self.keep_image(ref)
        _log(f"real node {name} Ready in {time.monotonic() - started:.1f}s")

    def _node_ready(self, name: str) -> bool:
        if not self._apiserver_ready():
            return False
        try:
            result = self.kubectl(
                "get",
                "node",
                name,
                "-o",
                'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
                check=False,
                timeout=10,
            )
        except subprocess.TimeoutExpired:
            return False
        return result.returncode == 0 and result.stdout.strip() == "True"

    def import_image(self, archive: Path, ref: str | None = None, keep: bool = True) -> str:
        """Import an OCI archive into the real node's containerd; the name Pods use for it.

        `keep`: hold it with a keeper Pod, out of the image GC's reach (keep_image).
        """
        node = self.real_node
        if node is None or node.running().get("containerd") is None:
            raise SystemExit("no real node runs: `hack/cluster up --real-node` first")
        try:
            name = node.import_image(archive, ref)
        except ValueError as error:
            raise SystemExit(str(error)) from None
        if keep:
            self.keep_image(name)
        return name

    def keep_image(self, ref: str) -> None:
        """Hold an imported image on the real node with a keeper Pod (realnode.keeper_pod).

        The kubelet's image GC then never removes it: no registry could bring it back.
        """
        node = self.real_node
        assert node is not None
        bundle_ref = (node.root / "agent-bundle.ref").read_text().strip()
        if self.kubectl("get", "pod", "-n", realnode.KEEPER_NAMESPACE, realnode.keeper_name(ref),
                        check=False).returncode == 0:  # fmt: skip
            return
        manifest = json.dumps(realnode.keeper_pod(ref, bundle_ref, node.spec.name))
        deadline = time.monotonic() + 60
        while True:  # a fresh cluster's kube-system has no default ServiceAccount for a moment
            created = self.kubectl("create", "-f", "-", stdin=manifest, check=False)
            if created.returncode == 0 or "AlreadyExists" in created.stderr:
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"the keeper Pod of {ref} was refused: {created.stderr.strip()}")
            time.sleep(0.5)

    def trust_registry(self, host: str, ca: Path) -> Path:
        """Let the real node's containerd pull from `host` over TLS signed by `ca` (hosts.toml)."""
        node = self.real_node
        if node is None:
            raise SystemExit("no real node: `hack/cluster up --real-node` first")
        return node.trust_registry(host, ca)

    def down(self, quiet: bool = False) -> None:
        """Stop every daemon (reverse order) and remove all state; leaves no process or port."""
        node = self.real_node
        if node is None and _owns_node_link(self.state_dir):
            node = RealNode(self.state_dir, RealNodeSpec(), self.pki)
        if node is not None:
            node.teardown(quiet=quiet)
        for daemon in reversed(self.daemons()):
            if daemon.pid() is not None and not quiet:
                _log(f"stopping {daemon.name}")
            daemon.stop()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.real_node_spec = None
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
        if not wanted:
            return
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
            "real_node": (
                {
                    "name": self.real_node_spec.name,
                    "ip": NODE_IP,
                    "containerd": str(self.real_node.containerd_socket),
                }
                if self.real_node_spec and self.real_node
                else None
            ),
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
            if self.real_node_spec is not None:
                name = self.real_node_spec.name
                state = "Ready" if self._node_ready(name) else "not Ready"
                print(f"{'real node':<24} {name} {NODE_IP} {state} ({self.real_node_spec.region})")
            print(f"{'kubeconfig':<24} {self.kubeconfig}")
        return ready


def _owns_node_link(state_dir: Path) -> bool:
    """Whether the host's real-node interface belongs to this cluster (it survives a lost state dir)."""
    return realnode.host_owner() == str(state_dir)
