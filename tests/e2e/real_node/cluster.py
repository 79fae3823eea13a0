"""A separate local cluster with one real gVisor node, for e2e tests (its own state dir and ports)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localcluster.addresses import REAL_NODE_TEST_ENV
from tests.support.kube import Kubectl, wait_until

REPO = Path(__file__).resolve().parents[3]
HACK_CLUSTER = REPO / "hack" / "cluster"
SANDBOX_IMAGE = "sandfleet/sandbox:0.1.0"  # imported by `up --real-node`; imagePullPolicy: Never
RUNTIME_CLASS = "gvisor"
NODE_NAME = "sandfleet-real-node"
REAL_NODE_LABEL = "sandfleet.dev/real-node"

REAL_CLUSTER_ENV = REAL_NODE_TEST_ENV
# The agent refuses to start without a bearer token: test Pods of the sandbox image carry this one.
AGENT_TOKEN = secrets.token_hex(16)
AGENT_HEADERS = {"Authorization": f"Bearer {AGENT_TOKEN}"}


class RealClusterError(Exception):
    """`hack/cluster` failed; the message carries the end of its output."""


@dataclass
class RealCluster:
    """The cluster around one real node: what a test needs to drive it."""

    env: dict[str, str] = field(default_factory=lambda: {**os.environ, **REAL_CLUSTER_ENV})
    kubeconfig: Path = Path()
    bin_dir: Path = Path()
    node_name: str = NODE_NAME
    sandbox_image: str = SANDBOX_IMAGE
    runtime_class: str = RUNTIME_CLASS

    @property
    def state_dir(self) -> Path:
        return Path(self.env["SANDFLEET_CLUSTER_DIR"])

    @property
    def kubectl(self) -> Kubectl:
        """Admin kubectl (all namespaces)."""
        return Kubectl(self.bin_dir / "kubectl", self.kubeconfig)

    def hack(self, *args: str, timeout: float = 3600) -> str:
        """Run `hack/cluster ARGS` against this cluster; its stdout."""
        result = subprocess.run(
            [str(HACK_CLUSTER), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if result.returncode != 0:
            raise RealClusterError(f"hack/cluster {' '.join(args)} failed:\n{result.stderr[-4000:]}")
        return result.stdout.strip()

    def up(self, simulated_nodes: int = 0) -> bool:
        """Start the cluster, or reuse a running one: the real node only, or with kwok nodes too.

        True when this call started it (so its caller should stop it), False when it was running.
        """
        argv = ["up", "--real-node", "--nodes", str(simulated_nodes), "--gpu-nodes", "0"]
        result = subprocess.run(
            [str(HACK_CLUSTER), *argv], env=self.env, capture_output=True, text=True, timeout=3600
        )
        if result.returncode != 0:
            raise RealClusterError(f"hack/cluster {' '.join(argv)} failed:\n{result.stderr[-4000:]}")
        self.kubeconfig = Path(self.hack("kubeconfig"))
        self.bin_dir = Path(self.hack("bin-dir"))
        # `up` decides under its lock whether the cluster was already running, and says so.
        return "reusing the running cluster" not in result.stderr

    def down(self) -> None:
        self.hack("down", timeout=300)

    def import_image(self, archive: Path, ref: str | None = None) -> str:
        """Import an OCI archive into the node's containerd; the name to put in a Pod spec.

        `ref` names it (e.g. "sandfleet/operator:0.1.0"); without it the archive's own name is used.
        """
        args = ["import-image", str(archive)]
        if ref:
            args += ["--ref", ref]
        return self.hack(*args, timeout=600).splitlines()[-1]

    def trust_registry(self, host: str, ca: Path) -> Path:
        """Let the node's containerd pull from `host` over TLS signed by `ca`; the hosts.toml written."""
        return Path(self.hack("trust-registry", host, str(ca), timeout=60).splitlines()[-1])

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`ctr -n k8s.io ARGS` against the node's containerd (not checked)."""
        socket = self.state_dir / "node" / "containerd" / "containerd.sock"
        return subprocess.run(
            ["ctr", f"--address={socket}", "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    @property
    def registry_hosts_dir(self) -> Path:
        """containerd's `config_path` on the node (hosts.toml per registry host)."""
        return self.state_dir / "node" / "containerd" / "certs.d"

    @contextmanager
    def namespace(self, prefix: str = "rn") -> Iterator[Kubectl]:
        """A fresh namespace (with its default ServiceAccount), deleted afterwards; kubectl bound to it."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        admin = self.kubectl
        admin("create", "namespace", name)
        wait_until(
            lambda: admin.run("-n", name, "get", "serviceaccount", "default").returncode == 0,
            timeout=30,
            what=f"the default ServiceAccount in {name}",
        )
        try:
            yield admin.in_namespace(name)
        finally:
            admin("delete", "namespace", name, "--wait=false")

    def pod(
        self,
        name: str,
        *,
        gvisor: bool = True,
        labels: dict[str, str] | None = None,
        image: str | None = None,
    ) -> dict[str, Any]:
        """A Pod of the sandbox image on the real node, Ready when its agent answers /v1/ready."""
        spec: dict[str, Any] = {
            "nodeSelector": {REAL_NODE_LABEL: "true"},
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "agent",
                    "image": image or self.sandbox_image,
                    "imagePullPolicy": "Never",
                    "env": [{"name": "SANDFLEET_AGENT_TOKEN", "value": AGENT_TOKEN}],
                    "ports": [{"containerPort": 8000}],
                    "readinessProbe": {
                        "httpGet": {"path": "/v1/ready", "port": 8000},
                        "periodSeconds": 1,
                        "timeoutSeconds": 2,
                    },
                }
            ],
        }
        if gvisor:
            spec["runtimeClassName"] = self.runtime_class
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {"app": name}},
            "spec": spec,
        }


def http_get_from_pod(kube: Kubectl, pod: str, url: str, timeout_s: float = 3) -> str:
    """GET `url` from inside `pod` (its python3); the status code, or FAIL and the reason."""
    script = (
        "import ssl, sys, urllib.request\n"
        "try:\n"
        f"    r = urllib.request.urlopen(sys.argv[1], timeout={timeout_s}, "
        "context=ssl._create_unverified_context())\n"
        "    print(r.status, r.read(200).decode(errors='replace'))\n"
        "except Exception as e:\n"
        "    print('FAIL', e)\n"
    )
    return kube("exec", pod, "--", "python3", "-c", script, url, timeout=60).strip()


def pod_json(kube: Kubectl, name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(kube("get", "pod", name, "-o", "json"))
    return document
