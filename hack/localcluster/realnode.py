"""The real node: containerd (runc and runsc), kubelet, kube-proxy and kube-router on this host.

Everything it makes is its own: a port-less bridge interface holding the node IP (the apiserver binds and
advertises there, so pods reach it through the `kubernetes` Service), a bridge for the pod network,
containerd's root, state and socket, the kubelet's directories and cgroup root, all under the
cluster's state directory or named `sf*`. `teardown` removes all of it, whether or not `up` finished.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from localcluster import build, images, nodes
from localcluster.addresses import NODE_IP, REAL_POD_CIDR, REAL_POD_GATEWAY, SERVICE_CIDR
from localcluster.paths import REPO_ROOT
from localcluster.pki import Identity, Pki
from localcluster.processes import Daemon

# Private addresses on interfaces this project creates; nothing else is routed to or from pods.
POD_CIDR = REAL_POD_CIDR  # not kwok's fake pod IPs, not the Service range
POD_GATEWAY = REAL_POD_GATEWAY
NODE_LINK = "sfnode0"
BRIDGE = "sfbr0"
NODE_NAME = "sandfleet-real-node"
REAL_NODE_LABEL = "sandfleet.dev/real-node"
CLUSTER_DOMAIN = "cluster.local"
RUNTIME_CLASS = "gvisor"
RUNSC_HANDLER = "runsc"
CNI_BIN_DIR = Path("/usr/lib/cni")
CGROUP_ROOT = "/sandfleet-node"
GVISOR_SCRIPT = REPO_ROOT / "hack" / "gvisor"
SANDBOX_IMAGE_BUILD = REPO_ROOT / "sandbox_image" / "build"
# What a Pod spec names to run the sandbox image on the real node (imagePullPolicy: Never).
SANDBOX_IMAGE_REF = "sandfleet/sandbox:0.1.0"
# Sysctls the node needs: forwarding for Service traffic between pods on the bridge, and bridged
# frames through iptables so kube-proxy and kube-router see pod-to-pod traffic. Restored by teardown.
SYSCTLS = {
    "net.ipv4.ip_forward": "1",
    "net.bridge.bridge-nf-call-iptables": "1",
}
# Image garbage collection (the kubelet's defaults): above HIGH % of the image filesystem used,
# unused images go, least recently used first, until LOW %. SANDFLEET_IMAGE_GC_{HIGH,LOW,MIN_AGE}
# move them (a scratch node proving the GC; docs/real-node.md, "Images").
IMAGE_GC_HIGH_PERCENT = 85
IMAGE_GC_LOW_PERCENT = 80
IMAGE_GC_MIN_AGE = "2m"
# Images nothing can pull again (imported with `ctr`: the pause, sandbox and agent bundle images,
# anything `import-image` names) are each held by a keeper Pod whose container uses the image:
# the kubelet never collects an image a container on the node uses, and containerd 1.6 cannot
# pin one (its CRI reports no image as pinned; the pinned label arrived in 1.7).
KEEPER_NAMESPACE = "kube-system"
KEEPER_LABEL = "sandfleet.dev/image-keeper"
KEEPER_IMAGE_ANNOTATION = "sandfleet.dev/kept-image"
KEEPER_SLEEP = ["sleep", "2147483647"]
# Per-registry hosts (hosts.toml, and the CA it trusts) under the node's containerd directory.
REGISTRY_HOSTS_DIR = "containerd/certs.d"
# Chains and ipsets the node's components create; teardown removes whatever is left of them.
CHAIN_PREFIXES = ("KUBE-", "CNI-")
IPSET_PREFIXES = ("KUBE-", "kube-router-")


def _port(name: str, default: int) -> int:
    return int(os.environ.get(f"SANDFLEET_{name}_PORT", default))


@dataclass(frozen=True)
class NodePorts:
    """Ports of the node's daemons (SANDFLEET_<NAME>_PORT moves each); all on loopback or the node IP."""

    kubelet: int = _port("KUBELET", 10250)
    kubelet_healthz: int = _port("KUBELET_HEALTHZ", 10248)
    kube_proxy_metrics: int = _port("KUBE_PROXY_METRICS", 10249)
    kube_proxy_healthz: int = _port("KUBE_PROXY_HEALTHZ", 10256)


@dataclass(frozen=True)
class RealNodeSpec:
    """What `up --real-node` was asked for; saved in the state directory so later commands know."""

    region: str = "us-east1"
    name: str = NODE_NAME

    def __post_init__(self) -> None:
        if self.region not in {r.name for r in nodes.REGIONS}:
            known = ", ".join(r.name for r in nodes.REGIONS)
            raise ValueError(f"--real-node-region must be one of {known}, not {self.region!r}")

    @property
    def zone(self) -> str:
        return next(r.zones[0] for r in nodes.REGIONS if r.name == self.region)

    def labels(self) -> dict[str, str]:
        return {
            "topology.kubernetes.io/region": self.region,
            "topology.kubernetes.io/zone": self.zone,
            REAL_NODE_LABEL: "true",
        }

    @staticmethod
    def load(path: Path) -> RealNodeSpec | None:
        try:
            return RealNodeSpec(**json.loads(path.read_text()))
        except FileNotFoundError:
            return None

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")


def identities(spec: RealNodeSpec) -> tuple[Identity, ...]:
    """Client identities of the node's components, as upstream's RBAC bootstrap policy names them."""
    return (
        Identity("kubelet", f"system:node:{spec.name}", ("system:nodes",)),
        Identity("kube-proxy", "system:kube-proxy"),
        Identity("kube-router", "sandfleet:kube-router"),
    )


def _log(message: str) -> None:
    print(f"[hack/cluster real-node] {message}", file=sys.stderr, flush=True)


def _run(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {result.stderr.strip() or result.stdout.strip()}")
    return result


def gvisor_bin_dir() -> Path:
    """Build (or reuse) runsc and containerd-shim-runsc-v1 with hack/gvisor; where they are."""
    built = subprocess.run([str(GVISOR_SCRIPT), "build"], stdout=sys.stderr, check=False)
    if built.returncode != 0:
        raise SystemExit("hack/gvisor build failed (see above)")
    return Path(_run(str(GVISOR_SCRIPT), "bin-dir").stdout.strip())


def sandbox_image_archive() -> Path:
    """Build (or reuse) the sandbox image with sandbox_image/build; its OCI archive."""
    built = subprocess.run(
        [str(SANDBOX_IMAGE_BUILD), "--json"], stdout=subprocess.PIPE, text=True, check=False
    )
    if built.returncode != 0:
        raise SystemExit("sandbox_image/build failed (see above)")
    return Path(json.loads(built.stdout.strip().splitlines()[-1])["archive"])


def agent_bundle_image_archive() -> tuple[Path, str]:
    """Build (or reuse) the agent bundle image (pools with agent: injected); its archive and name.

    Its name is the operator's and the chart's default (`localhost/sandfleet/agent-bundle:<version>`).
    """
    built = subprocess.run(
        [str(SANDBOX_IMAGE_BUILD), "--json", "agent-bundle-image"],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        raise SystemExit("sandbox_image/build agent-bundle-image failed (see above)")
    result = json.loads(built.stdout.strip().splitlines()[-1])
    return Path(result["archive"]), str(result["ref"])


class RealNode:
    """One real node rooted in the cluster's state directory."""

    def __init__(self, state_dir: Path, spec: RealNodeSpec, pki: Pki, ports: NodePorts | None = None) -> None:
        self.spec = spec
        self.root = state_dir / "node"
        self.state_dir = state_dir
        self.pki = pki
        self.ports = ports or NodePorts()

    # -- paths ----------------------------------------------------------------------------------

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def runsc_root(self) -> Path:
        return self.root / "runsc"

    @property
    def registry_hosts(self) -> Path:
        """The CRI's registry `config_path`: a directory per registry host, read at every pull."""
        return self.root / REGISTRY_HOSTS_DIR

    def ctr(self) -> list[str]:
        """The `ctr` command line for this node's containerd."""
        return ["ctr", f"--address={self.containerd_socket}"]

    def trust_registry(self, host: str, ca: Path) -> Path:
        """Let containerd pull from `host` (HOST[:PORT]) over TLS signed by `ca`; the hosts.toml written.

        Read at every pull, so no restart; credentials come from each Pod's imagePullSecrets.
        """
        directory = self.registry_hosts / host
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "ca.crt").write_bytes(ca.read_bytes())
        hosts = directory / "hosts.toml"
        hosts.write_text(registry_hosts_toml(host, directory / "ca.crt"))
        return hosts

    # -- daemons --------------------------------------------------------------------------------

    def daemons(self) -> list[Daemon]:
        """containerd, kubelet, kube-proxy and kube-router, in start order."""
        node_bin = build.binary("kubelet").parent
        r = self.root
        return [
            Daemon(
                "containerd", ("/usr/bin/containerd", f"--config={r / 'containerd.toml'}"), self.state_dir
            ),
            Daemon(
                "kubelet",
                (
                    str(node_bin / "kubelet"),
                    f"--config={r / 'kubelet.yaml'}",
                    f"--kubeconfig={self.pki.kubeconfig('kubelet')}",
                    f"--root-dir={r / 'kubelet'}",
                    f"--cert-dir={r / 'kubelet' / 'pki'}",
                    f"--hostname-override={self.spec.name}",
                    f"--node-ip={NODE_IP}",
                    "--node-labels=" + ",".join(f"{k}={v}" for k, v in self.spec.labels().items()),
                    "--v=1",
                ),
                self.state_dir,
            ),
            Daemon(
                "kube-proxy",
                (
                    str(node_bin / "kube-proxy"),
                    f"--config={r / 'kube-proxy.yaml'}",
                    f"--hostname-override={self.spec.name}",
                    "--v=1",
                ),
                self.state_dir,
            ),
            Daemon(
                "kube-router",
                (
                    str(build.binary("kube-router")),
                    f"--kubeconfig={self.pki.kubeconfig('kube-router')}",
                    f"--hostname-override={self.spec.name}",
                    # NetworkPolicy only: kube-proxy owns Services and nothing routes between nodes.
                    "--run-firewall=true",
                    "--run-router=false",
                    "--run-service-proxy=false",
                    "--enable-cni=false",
                    # Its health server listens on every address; it is not needed here.
                    "--health-port=0",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--v=1",
                ),
                self.state_dir,
            ),
        ]

    def running(self) -> dict[str, int | None]:
        return {d.name: d.pid() for d in self.daemons()}

    # -- host set-up ----------------------------------------------------------------------------

    def claim_host(self) -> None:
        """Make the node's interface, or refuse if another cluster on this host already has a real node.

        The node IP, bridge, iptables chains and cgroup root are host-wide, so one real node at a time.
        """
        owner = host_owner()
        if owner is not None:
            if owner and owner != str(self.state_dir) and Path(owner, "real-node.json").exists():
                raise SystemExit(
                    f"a real node already runs on this host for the cluster in {owner}: "
                    f"SANDFLEET_CLUSTER_DIR={owner} hack/cluster down first"
                )
            _run("ip", "link", "del", NODE_LINK)
        # A bridge with no ports: this kernel has no dummy driver, and local delivery works the same.
        _run("ip", "link", "add", NODE_LINK, "type", "bridge")
        # The alias records which cluster owns the host's real node (checked above by the next one).
        _run("ip", "link", "set", NODE_LINK, "alias", str(self.state_dir))
        _run("ip", "addr", "add", f"{NODE_IP}/32", "dev", NODE_LINK)
        _run("ip", "link", "set", NODE_LINK, "up")
        # Service addresses route into the port-less bridge: kube-proxy's DNAT sends real traffic on
        # to a pod, and a packet for an address no Service (yet) holds is dropped there instead of
        # leaving the host by its default route.
        _run("ip", "route", "replace", SERVICE_CIDR, "dev", NODE_LINK)
        self.root.mkdir(parents=True, exist_ok=True)
        saved_file = self.root / "sysctls.json"
        saved = {}
        for key, value in SYSCTLS.items():
            path = Path("/proc/sys") / key.replace(".", "/")
            if not path.exists() and key.startswith("net.bridge."):
                _run("modprobe", "br_netfilter", check=False)
            saved[key] = path.read_text().strip()
            path.write_text(value)
        # A second claim after a half-finished `up` must not record our own values as the originals.
        if not saved_file.exists():
            saved_file.write_text(json.dumps(saved))
        for controller in _cgroup_v1_controllers():
            (controller / CGROUP_ROOT.lstrip("/")).mkdir(exist_ok=True)

    def write_configs(self, gvisor_bin: Path, pause_ref: str) -> None:
        r = self.root
        subs = ("containerd/root", "containerd/state", REGISTRY_HOSTS_DIR, "cni/net.d", "cni/ipam")
        for sub in (*subs, "kubelet", "pod-logs"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        # containerd finds a runtime's shim on its PATH: this directory holds only ours (patched,
        # see build.RUNSC_SHIM_PATCHES); the shim runs hack/gvisor's runsc named in runsc.toml.
        (r / "bin").mkdir(exist_ok=True)
        shim = r / "bin" / "containerd-shim-runsc-v1"
        shim.unlink(missing_ok=True)
        shim.symlink_to(build.binary("containerd-shim-runsc-v1"))
        (r / "runsc.toml").write_text(
            "# The runsc shim's options (containerd passes this file as the runtime's ConfigPath).\n"
            f'binary_name = "{gvisor_bin / "runsc"}"\n'
            f'root = "{self.runsc_root}"\n'
            f'log_path = "{self.state_dir / "logs" / "runsc" / "%ID%"}/shim.log"\n'
            'log_level = "info"\n'
        )
        (r / "containerd.toml").write_text(containerd_config(self.root, pause_ref))
        (r / "cni" / "net.d" / "10-sandfleet.conflist").write_text(
            json.dumps(cni_config(self.root), indent=2)
        )
        # No DNS server runs in this cluster: pods get a resolv.conf without nameservers, so a name
        # lookup fails at once instead of sending queries off the host.
        (r / "resolv.conf").write_text("# sandfleet real node: no cluster DNS\noptions ndots:1\n")
        (r / "kubelet.yaml").write_text(yaml.safe_dump(kubelet_config(self.root, self.pki, self.ports)))
        (r / "kube-proxy.yaml").write_text(
            yaml.safe_dump(kube_proxy_config(self.pki.kubeconfig("kube-proxy"), self.ports))
        )

    # -- bring-up -------------------------------------------------------------------------------

    def start_runtime(self) -> None:
        """Start containerd (with runsc's shim on its PATH) and wait for its socket."""
        containerd = self.daemons()[0]
        env = {**os.environ, "PATH": f"{self.root / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        containerd.start(env=env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if containerd.pid() is None:
                raise SystemExit(f"containerd exited while starting; its log:\n{containerd.log_tail()}")
            if _run(*self.ctr(), "version", check=False, timeout=10).returncode == 0:
                return
            time.sleep(0.2)
        raise SystemExit(f"containerd not ready after 30s; its log:\n{containerd.log_tail()}")

    def import_image(self, archive: Path, ref: str | None = None) -> str:
        started = time.monotonic()
        name = images.import_archive(self.ctr(), archive, ref)
        _log(
            f"imported {name} ({archive.stat().st_size / 2**20:.0f} MiB) in {time.monotonic() - started:.1f}s"
        )
        return name

    def start(self, *names: str) -> list[Daemon]:
        """Start the named daemons (kube-router only once the Node object exists: it looks itself up)."""
        started = [d for d in self.daemons() if d.name in names]
        for daemon in started:
            daemon.start()
        return started

    # -- teardown -------------------------------------------------------------------------------

    def teardown(self, quiet: bool = False) -> None:
        """Stop the node and remove everything it made on the host; safe to run at any point.

        Host-wide things (interfaces, chains, ipsets, cgroup root, sysctls) are only touched when
        this cluster owns the host's real node, or none does: never another cluster's.
        """
        containerd, kubelet, proxy, router = self.daemons()
        started = time.monotonic()
        for daemon in (kubelet, router, proxy):
            if daemon.pid() is not None and not quiet:
                _log(f"stopping {daemon.name}")
            daemon.stop()
        sockets = self._shim_sockets()
        if containerd.pid() is not None:
            self._kill_tasks()
            containerd.stop()
        self._kill_leftovers()
        for socket in sockets:
            socket.unlink(missing_ok=True)
        # containerd 1.6 keeps shim sockets (and ctr its fifos) in fixed host directories: drop
        # them once empty, as they were before the node (or any containerd) ran.
        for directory in (
            "/run/containerd/s",
            "/run/containerd/fifo",
            "/run/containerd/runc/k8s.io",
            "/run/containerd/runc",
            "/run/containerd",
        ):
            with contextlib.suppress(OSError):
                Path(directory).rmdir()
        self._unmount_all()
        owner = host_owner()
        if owner not in (None, str(self.state_dir)):
            if not quiet:
                _log(f"the host's real node belongs to {owner}: left alone")
            return
        self._clean_netfilter()
        for link in (BRIDGE, NODE_LINK):
            if _run("ip", "link", "show", link, check=False).returncode == 0:
                _run("ip", "link", "del", link, check=False)
        self._remove_cgroups()
        saved = self.root / "sysctls.json"
        if saved.exists():
            for key, value in json.loads(saved.read_text()).items():
                with contextlib.suppress(OSError):
                    (Path("/proc/sys") / key.replace(".", "/")).write_text(value)
            saved.unlink()
        if not quiet:
            _log(f"real node removed from the host in {time.monotonic() - started:.1f}s")

    def _shim_sockets(self) -> list[Path]:
        """The shims' sockets (containerd 1.6 puts them in /run/containerd/s/, named by a hash)."""
        tasks = self.root / "containerd" / "state" / "io.containerd.runtime.v2.task"
        found = []
        for address in tasks.glob("*/*/address"):
            with contextlib.suppress(OSError):
                path = Path(address.read_text().strip().removeprefix("unix://"))
                if path.parent == Path("/run/containerd/s"):
                    found.append(path)
        return found

    def _kill_tasks(self) -> None:
        """Kill every container's task so the shims exit before containerd stops."""
        listed = _run(*self.ctr(), "-n", "k8s.io", "tasks", "ls", "-q", check=False, timeout=20)
        for task in listed.stdout.split():
            _run(*self.ctr(), "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", "-a", task, check=False)
        deadline = time.monotonic() + 10
        for task in listed.stdout.split():
            while time.monotonic() < deadline:
                deleted = _run(*self.ctr(), "-n", "k8s.io", "tasks", "delete", "-f", task, check=False)
                if deleted.returncode == 0 or "not found" in deleted.stderr:
                    break
                time.sleep(0.2)

    def _kill_leftovers(self) -> None:
        """Shims and runsc sandboxes outlive containerd: find ours by our paths in their command line."""
        # Shims name containerd's socket (-address), runsc's sandboxes and gofers its --root.
        markers = (str(self.containerd_socket), str(self.runsc_root))
        for _ in range(50):
            found = [pid for pid, argv in _processes() if any(m in argv for m in markers)]
            if not found:
                return
            for pid in found:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def _unmount_all(self) -> None:
        """Unmount everything under the node's root, deepest first (overlays, netns, volumes)."""
        for _ in range(3):
            mounted = [m for m in _mount_points() if m == str(self.root) or m.startswith(f"{self.root}/")]
            if not mounted:
                return
            for point in sorted(mounted, key=len, reverse=True):
                _run("umount", "-l", point, check=False)

    def _clean_netfilter(self) -> None:
        """kube-proxy's own clean-up, then any chains and ipsets of the node's components left over.

        Not `kube-router --cleanup-config`: after its firewall it cleans up its service proxy, which
        deletes every IPVS service on the host and (v2.1.0) then crashes.
        """
        proxy = build.binary("kube-proxy")
        if proxy.exists():
            _run(str(proxy), "--cleanup", check=False, timeout=60)
        for table in ("filter", "nat", "mangle", "raw"):
            rules = _run("iptables-save", "-t", table, check=False).stdout
            chains = [c for c in re.findall(r"^:(\S+)", rules, re.M) if c.startswith(CHAIN_PREFIXES)]
            for line in rules.splitlines():
                # Jumps from the built-in chains into ours go first, or the chains cannot be deleted.
                match = re.match(r"-A (\S+) (.*-j (\S+).*)$", line)
                if match and match.group(3) in chains and not match.group(1).startswith(CHAIN_PREFIXES):
                    _run(
                        "iptables",
                        "-t",
                        table,
                        "-D",
                        match.group(1),
                        *shlex.split(match.group(2)),
                        check=False,
                    )
            for chain in chains:
                _run("iptables", "-t", table, "-F", chain, check=False)
            for chain in chains:
                _run("iptables", "-t", table, "-X", chain, check=False)
        sets = _run("ipset", "list", "-n", check=False).stdout.split()
        for name in sets:
            if name.startswith(IPSET_PREFIXES):
                _run("ipset", "destroy", name, check=False)

    def _remove_cgroups(self) -> None:
        for controller in _cgroup_v1_controllers():
            top = controller / CGROUP_ROOT.lstrip("/")
            if top.is_dir():
                # Children first: a cgroup directory can only be removed once it has none.
                for directory in sorted(
                    (p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
                ):
                    with contextlib.suppress(OSError):
                        directory.rmdir()
                with contextlib.suppress(OSError):
                    top.rmdir()


def host_owner() -> str | None:
    """The state directory of the cluster whose real node this host runs ("" if unknown), or None."""
    link = _run("ip", "-j", "-d", "link", "show", NODE_LINK, check=False)
    if link.returncode != 0:
        return None
    return str(json.loads(link.stdout)[0].get("ifalias", ""))


def _cgroup_v1_controllers() -> list[Path]:
    """The mounted cgroup v1 hierarchies (this host mounts them under a tmpfs at /sys/fs/cgroup)."""
    found = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            if fstype == "cgroup":
                found.append(Path(fields[4]))
    return found


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as mountinfo:
        return [line.split()[4] for line in mountinfo]


def _processes() -> list[tuple[int, str]]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
    return found


# -- configuration documents (pure: unit-tested) ----------------------------------------------


def containerd_config(root: Path, pause_ref: str) -> str:
    """The config of containerd: own root, state and socket under `root`; runc default, runsc handler."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""# containerd for the sandfleet real node (generated by hack/cluster up --real-node).
version = 2
root = "{root / "containerd" / "root"}"
state = "{root / "containerd" / "state"}"

[grpc]
  address = "{root / "containerd" / "containerd.sock"}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "containerd" / "opt"}"

[{cri}]
  sandbox_image = "{pause_ref}"
  # Network namespaces under our own state directory, so teardown finds every one of them.
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  # Root here lacks CAP_SYS_RESOURCE, so no process may lower its oom_score_adj below 0: keep the
  # CRI's scores (the pause container's -998) at or above containerd's own instead of failing.
  restrict_oom_score_adj = true
  enable_unprivileged_ports = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{root / "runc"}"

[{cri}.containerd.runtimes.{RUNSC_HANDLER}]
  runtime_type = "io.containerd.runsc.v1"

[{cri}.containerd.runtimes.{RUNSC_HANDLER}.options]
  TypeUrl = "io.containerd.runsc.v1.options"
  ConfigPath = "{root / "runsc.toml"}"

# Registries: one directory per host (hosts.toml with its CA; `hack/cluster trust-registry`).
[{cri}.registry]
  config_path = "{root / REGISTRY_HOSTS_DIR}"

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{root / "cni" / "net.d"}"
  max_conf_num = 1
"""


def registry_hosts_toml(host: str, ca: Path) -> str:
    """The hosts.toml of one registry: HTTPS, pull and resolve, this CA."""
    return (
        f"# {host}: trusted by hack/cluster trust-registry\n"
        f'server = "https://{host}"\n\n'
        f'[host."https://{host}"]\n'
        '  capabilities = ["pull", "resolve"]\n'
        f'  ca = "{ca}"\n'
    )


def image_gc_policy(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The kubelet's image GC settings (SANDFLEET_IMAGE_GC_HIGH, _LOW, _MIN_AGE override them)."""
    env = os.environ if environ is None else environ
    high = int(env.get("SANDFLEET_IMAGE_GC_HIGH", IMAGE_GC_HIGH_PERCENT))
    low = int(env.get("SANDFLEET_IMAGE_GC_LOW", IMAGE_GC_LOW_PERCENT))
    if not 0 <= low < high <= 100:
        raise SystemExit(f"image GC thresholds need 0 <= low < high <= 100, not low {low}, high {high}")
    return {
        "imageGCHighThresholdPercent": high,
        "imageGCLowThresholdPercent": low,
        "imageMinimumGCAge": env.get("SANDFLEET_IMAGE_GC_MIN_AGE", IMAGE_GC_MIN_AGE),
    }


def keeper_name(ref: str) -> str:
    return f"sandfleet-keep-{hashlib.sha256(ref.encode()).hexdigest()[:12]}"


def keeper_pod(ref: str, bundle_ref: str, node: str = NODE_NAME) -> dict[str, Any]:
    """A Pod on the real node whose one container uses image `ref`, so the kubelet never collects it.

    The container sleeps with busybox from the agent bundle image (copied by an init container into
    a small emptyDir), so it runs in any image, with or without a shell. runc, not gVisor: it only
    has to exist. No token, no service links, nobody's uid, read-only root, no capabilities.
    """
    own = ref == bundle_ref
    security = {
        "runAsUser": 65534,
        "runAsGroup": 65534,
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    resources = {"requests": {"cpu": "1m", "memory": "4Mi"}, "limits": {"memory": "16Mi"}}
    busybox = "/.sandfleet/bin/busybox"
    container: dict[str, Any] = {
        "name": "keep",
        "image": ref,
        "imagePullPolicy": "Never",
        "command": [busybox if own else "/keep/busybox", *KEEPER_SLEEP],
        "securityContext": security,
        "resources": resources,
    }
    spec: dict[str, Any] = {
        "nodeName": node,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 0,
        "priorityClassName": "system-node-critical",
        "tolerations": [{"operator": "Exists"}],
        "containers": [container],
    }
    if not own:
        container["volumeMounts"] = [{"name": "keep", "mountPath": "/keep", "readOnly": True}]
        spec["volumes"] = [{"name": "keep", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}}]
        spec["initContainers"] = [
            {
                "name": "busybox",
                "image": bundle_ref,
                "imagePullPolicy": "Never",
                "command": [busybox, "cp", busybox, "/keep/busybox"],
                "volumeMounts": [{"name": "keep", "mountPath": "/keep"}],
                "securityContext": security,
                "resources": resources,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": keeper_name(ref),
            "namespace": KEEPER_NAMESPACE,
            "labels": {KEEPER_LABEL: "true"},
            "annotations": {KEEPER_IMAGE_ANNOTATION: ref},
        },
        "spec": spec,
    }


def cni_config(root: Path) -> dict[str, Any]:
    """The CNI chain: bridge, host-local, portmap; routes to the node IP and Services only (no default)."""
    return {
        "cniVersion": "1.0.0",
        "name": "sandfleet",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR, "gateway": POD_GATEWAY}]],
                    # No default route: a pod can reach other pods, the node IP and Services, and
                    # nothing beyond this host.
                    "routes": [{"dst": f"{NODE_IP}/32"}, {"dst": SERVICE_CIDR}],
                    "dataDir": str(root / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(root: Path, pki: Pki, ports: NodePorts) -> dict[str, Any]:
    """The kubelet's configuration for this host (cgroup v1 via cgroupfs, swap tolerated, no DNS)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": ports.kubelet,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports.kubelet_healthz,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki.ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{root / 'containerd' / 'containerd.sock'}",
        # This host mounts cgroup v1 controllers (plus a cgroup2 "unified" tree) and has no systemd.
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "cgroupRoot": CGROUP_ROOT,
        "failSwapOn": False,
        "clusterDomain": CLUSTER_DOMAIN,
        # No cluster DNS server exists: pods fall back to this resolv.conf, which names none.
        "clusterDNS": [],
        "resolvConf": str(root / "resolv.conf"),
        "podLogsDirectory": str(root / "pod-logs"),
        "volumePluginDir": str(root / "kubelet" / "volume-plugins"),
        "maxPods": 110,
        "serializeImagePulls": False,
        # Pulled images are collected as on any node; the imported ones, which no registry serves,
        # are each held by a keeper Pod (keeper_pod) and so never unused.
        **image_gc_policy(),
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "registerNode": True,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
    }


def kube_proxy_config(kubeconfig: Path, ports: NodePorts) -> dict[str, Any]:
    """kube-proxy in iptables mode, leaving the host's conntrack and localnet sysctls alone."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "clusterCIDR": POD_CIDR,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": f"127.0.0.1:{ports.kube_proxy_healthz}",
        "metricsBindAddress": f"127.0.0.1:{ports.kube_proxy_metrics}",
        "nodePortAddresses": [f"{NODE_IP}/32"],
        # 0 keeps the host's own conntrack settings; kube-proxy would raise them otherwise.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "iptables": {"localhostNodePorts": False, "syncPeriod": "30s", "minSyncPeriod": "0s"},
    }


KUBE_ROUTER_RBAC: list[dict[str, Any]] = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "sandfleet:kube-router"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["namespaces", "pods", "services", "nodes", "endpoints"],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": ["networking.k8s.io"],
                "resources": ["networkpolicies"],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["get", "list", "watch"],
            },
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "sandfleet:kube-router"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "sandfleet:kube-router",
        },
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "sandfleet:kube-router"}
        ],
    },
]

RUNTIME_CLASS_MANIFEST: dict[str, Any] = {
    "apiVersion": "node.k8s.io/v1",
    "kind": "RuntimeClass",
    "metadata": {"name": RUNTIME_CLASS},
    "handler": RUNSC_HANDLER,
}
