"""Benchmark: a cold sandbox Pod on the real gVisor node, from created to Ready, by phase.

Prints progress and a summary (p50/p99 per phase) on stderr, then one JSON object as the last line
of stdout (and, with --json FILE, into FILE). Each Pod is created alone, like the operator's sandbox
Pods (runtimeClassName gvisor, the sandbox image already imported, readiness = the agent's exec
path answering), timed from the create request by a watch: scheduled (bound to the node), started
(the container running), ready (the Ready condition). Each is deleted, and gone, before the next.
Uses the real-node cluster of the e2e tests (/tmp/sandfleet-real-node-test and its ports: one real
node fits on a host), starting it if it is not running and then removing it unless --keep.

    .venv/bin/python bench/real_node_pods.py            # full: 30 Pods
    .venv/bin/python bench/real_node_pods.py --short    # CI: 10 Pods
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from sandfleet.kube.api_calls import KubeClient
from sandfleet.kube.config import api_client, load_configuration
from sandfleet.kube.errors import KubeError
from sandfleet.kube.informer import Informer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack"))
from localcluster.addresses import REAL_NODE_TEST_ENV  # noqa: E402

CLUSTER = REPO / "hack" / "cluster"
IMAGE = "sandfleet/sandbox:0.1.0"  # the name `hack/cluster up --real-node` imports the image as
TARGET_READY_P50_S = 2.0
PHASES = ("scheduled", "started", "ready")
BENCH_ENV = REAL_NODE_TEST_ENV  # the e2e suites' cluster: one real node fits on a host


def log(message: str) -> None:
    print(f"[bench real_node] {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def summary(values: list[float], prefix: str) -> dict[str, float]:
    return {
        f"{prefix}_p50_s": round(percentile(values, 50), 4),
        f"{prefix}_p99_s": round(percentile(values, 99), 4),
        f"{prefix}_mean_s": round(statistics.fmean(values), 4),
        f"{prefix}_max_s": round(max(values), 4),
    }


def hack(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **BENCH_ENV}
    result = subprocess.run([str(CLUSTER), *args], env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise SystemExit(f"hack/cluster {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return result


def sandbox_image_bytes() -> int:
    """The size of the sandbox image's OCI archive (what `up --real-node` imports)."""
    built = subprocess.run(
        [str(REPO / "sandbox_image" / "build"), "--json"], capture_output=True, text=True, check=True
    )
    return Path(json.loads(built.stdout.strip().splitlines()[-1])["archive"]).stat().st_size


def pod_manifest(name: str) -> dict[str, Any]:
    """As the operator makes a sandbox Pod (see operator/sandfleet/core/pods.py)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "real-node-bench"}},
        "spec": {
            "runtimeClassName": "gvisor",
            "nodeSelector": {"sandfleet.dev/real-node": "true"},
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "sandbox",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "ports": [{"name": "agent", "containerPort": 8000}],
                    "readinessProbe": {
                        "httpGet": {"path": "/v1/ready", "port": 8000},
                        "periodSeconds": 1,
                        "failureThreshold": 3,
                    },
                }
            ],
        },
    }


def phases_seen(pod: dict[str, Any]) -> set[str]:
    seen = set()
    status = pod.get("status") or {}
    if (pod.get("spec") or {}).get("nodeName"):
        seen.add("scheduled")
    for container in status.get("containerStatuses") or ():
        if (container.get("state") or {}).get("running"):
            seen.add("started")
    for condition in status.get("conditions") or ():
        if condition.get("type") == "Ready" and condition.get("status") == "True":
            seen.add("ready")
    return seen


async def one_pod(kube: KubeClient, namespace: str, name: str, limit_s: float = 120) -> dict[str, float]:
    """Create one Pod and time its phases from a watch opened before the create; then delete it."""
    stamps: dict[str, float] = {}
    watching, ready = asyncio.Event(), asyncio.Event()

    def on_event(kind: str, pod: dict[str, Any]) -> None:
        now = time.monotonic()
        for phase in phases_seen(pod) if pod else ():
            stamps.setdefault(phase, now)
        if "ready" in stamps:
            ready.set()

    pods = f"/api/v1/namespaces/{namespace}/pods"
    informer = Informer(kube, pods, on_event, watching.set, query={"fieldSelector": f"metadata.name={name}"})
    watcher = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(watching.wait(), limit_s)  # listed (empty): the watch opens next
        await asyncio.sleep(0.05)  # the watch request is on the wire before the Pod exists
        started = time.monotonic()
        await kube.send("POST", pods, body=pod_manifest(name))
        created = time.monotonic()
        try:
            await asyncio.wait_for(ready.wait(), limit_s)
        except TimeoutError:
            raise SystemExit(
                f"pod {name} not Ready after {limit_s:.0f}s (phases seen: {sorted(stamps)})"
            ) from None
    finally:
        watcher.cancel()
    result = {"create_call": created - started}
    result.update({phase: stamps[phase] - started for phase in PHASES if phase in stamps})
    deleting = time.monotonic()
    # Not 0: that removes the object at once and the sandbox's teardown would overlap the next
    # measurement; with 1 the kubelet removes it only once the containers are gone.
    await kube.send("DELETE", f"{pods}/{name}", body={"gracePeriodSeconds": 1})
    while True:
        try:
            await kube.send("GET", f"{pods}/{name}")
        except KubeError as error:
            if error.status == 404:
                break
            raise
        await asyncio.sleep(0.1)
    result["deleted"] = time.monotonic() - deleting
    return result


async def run(count: int, kubeconfig: Path) -> dict[str, Any]:
    os.environ["KUBECONFIG"] = str(kubeconfig)
    kube = KubeClient(api_client(await load_configuration(), pool_size=4))
    try:
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        await kube.send("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
        # Pods need the namespace's default ServiceAccount, which the controller-manager makes.
        for _ in range(300):
            try:
                await kube.send("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
                break
            except KubeError:
                await asyncio.sleep(0.1)
        log("warm-up pod (first start pays one-off page-cache misses)")
        await one_pod(kube, namespace, "warmup")
        samples: list[dict[str, float]] = []
        for index in range(count):
            samples.append(await one_pod(kube, namespace, f"sandbox-{index:03d}"))
            if (index + 1) % 5 == 0 or index + 1 == count:
                log(f"{index + 1}/{count}: last ready {samples[-1]['ready']:.2f}s")
        await kube.send("DELETE", f"/api/v1/namespaces/{namespace}")
    finally:
        await kube.close()
    result: dict[str, Any] = {"benchmark": "real_node_pods", "pods": count}
    for phase in ("create_call", *PHASES, "deleted"):
        result.update(summary([s[phase] for s in samples], phase))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--short", action="store_true", help="10 Pods (CI)")
    parser.add_argument("--pods", type=int, default=None)
    parser.add_argument("--json", type=Path, help="also write the JSON result to this file")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    args = parser.parse_args()
    count = args.pods or (10 if args.short else 30)
    log("starting the real-node cluster (builds and images are cached after the first run)")
    started = time.monotonic()
    up = hack("up", "--real-node", "--nodes", "0", "--gpu-nodes", "0")
    up_s = time.monotonic() - started
    # `up` says, decided under its lock, whether the cluster was already running (a test session's).
    owner = not args.keep and "reusing the running cluster" not in up.stderr
    try:
        result = asyncio.run(run(count, Path(hack("kubeconfig").stdout.strip())))
    finally:
        if owner:  # a cluster someone else started (a test session) is theirs to stop
            hack("down", timeout=300)
    result["cluster_up_s"] = round(up_s, 1)
    result["image_archive_bytes"] = sandbox_image_bytes()
    result["target_ready_p50_s"] = TARGET_READY_P50_S
    result["meets_ready_target"] = bool(result["ready_p50_s"] <= TARGET_READY_P50_S)
    for phase in ("create_call", *PHASES, "deleted"):
        log(f"{phase:<12} p50 {result[f'{phase}_p50_s']:.3f}s  p99 {result[f'{phase}_p99_s']:.3f}s")
    log(f"image archive {result['image_archive_bytes'] / 2**20:.1f} MiB; cluster up {up_s:.1f}s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
