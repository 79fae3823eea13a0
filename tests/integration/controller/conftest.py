"""Fixtures for the operator on the real local cluster: the gvisor RuntimeClass and operator processes."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent_key import OPERATOR_KEY_ENV, fleet_key_file
from tests.support.kube import Kubectl, wait_until
from tests.support.servers import free_port

REPO = Path(__file__).resolve().parents[3]
SANDFLEET = REPO / ".venv" / "bin" / "sandfleet"
IMAGE = "sandfleet/sandbox:0.1.0"
POOL_LABEL = "sandfleet.dev/pool"


@pytest.fixture(scope="session")
def runtime_class(kubectl: Kubectl) -> str:
    """The gvisor RuntimeClass sandbox Pods name (the chart installs it on a real cluster)."""
    kubectl.apply(
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "gvisor"},
            "handler": "runsc",
        }
    )
    return "gvisor"


@dataclass
class OperatorProcess:
    """One `sandfleet operator` subprocess with its log file."""

    process: subprocess.Popen[bytes]
    log_path: Path
    metrics_port: int

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def spawn_operator(
    kubeconfig: Path, namespace: str, log_path: Path, key_file: Path, **env: str
) -> OperatorProcess:
    """`sandfleet operator -n <namespace>` on `kubeconfig`, logging to `log_path` (`env` added)."""
    port = free_port()
    environment = {**os.environ, "KUBECONFIG": str(kubeconfig), OPERATOR_KEY_ENV: str(key_file), **env}
    argv = [str(SANDFLEET), "operator", "-n", namespace, "--metrics-port", str(port)]
    argv += ["--leader-lease-seconds", "3"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=environment, cwd=REPO)
    return OperatorProcess(process, log_path, port)


@pytest.fixture
def start_operator(
    kubectl: Kubectl, namespace: str, tmp_path: Path, runtime_class: str
) -> Iterator[Callable[[], OperatorProcess]]:
    """Start `sandfleet operator -n <namespace>` (as often as a test needs); all are stopped afterwards."""
    started: list[OperatorProcess] = []

    def start() -> OperatorProcess:
        log_path = tmp_path / f"operator-{len(started)}.log"
        handle = spawn_operator(kubectl.kubeconfig, namespace, log_path, fleet_key_file(tmp_path))
        started.append(handle)
        return handle

    yield start
    for handle in started:
        handle.stop()


def pool_manifest(name: str, replicas: int, **spec: Any) -> dict[str, Any]:
    regions = spec.pop(
        "regions",
        [
            {"name": "us-east1", "weight": 2, "minWarm": 1},
            {"name": "europe-west4"},
            {"name": "asia-southeast1"},
        ],
    )
    template = {"image": IMAGE, "imagePullPolicy": "Never", **spec.pop("template", {})}
    return {
        "apiVersion": "sandfleet.dev/v1alpha1",
        "kind": "SandboxPool",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "regions": regions, "template": template, **spec},
    }


def pods(kube: Kubectl, pool: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.json("get", "pods", "-l", f"{POOL_LABEL}={pool}")["items"]
    return items


def live_pods(kube: Kubectl, pool: str) -> list[dict[str, Any]]:
    return [p for p in pods(kube, pool) if not p["metadata"].get("deletionTimestamp")]


def status(kube: Kubectl, pool: str) -> dict[str, Any]:
    found: dict[str, Any] = kube.json("get", "sandboxpool", pool).get("status") or {}
    return found


def condition(kube: Kubectl, pool: str, kind: str) -> dict[str, Any]:
    for found in status(kube, pool).get("conditions") or ():
        if found["type"] == kind:
            return dict(found)
    return {}


def wait_ready(
    kube: Kubectl, pool: str, operator: OperatorProcess | None = None, timeout: float = 90
) -> None:
    def filled() -> bool:
        return condition(kube, pool, "Ready").get("status") == "True"

    try:
        wait_until(filled, timeout=timeout, what=f"pool {pool} to report Ready=True", interval=0.5)
    except AssertionError as error:
        log = operator.log() if operator else ""
        raise AssertionError(f"{error}; status: {status(kube, pool)}\noperator log:\n{log}") from None


def region_counts(items: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for pod in items:
        region = pod["metadata"]["labels"]["sandfleet.dev/region"]
        counts[region] = counts.get(region, 0) + 1
    return counts


@dataclass
class PodCounter:
    """Samples a pool's live Pod count in the background; `peak` is the most it ever saw."""

    kube: Kubectl
    pool: str
    samples: list[int] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> PodCounter:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                items = live_pods(self.kube, self.pool)
            except Exception:
                time.sleep(0.2)
                continue
            self.samples.append(len(items))
            self.names.update(p["metadata"]["name"] for p in items)
            time.sleep(0.2)

    @property
    def peak(self) -> int:
        return max(self.samples, default=0)
