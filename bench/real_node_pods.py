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

from kubernetes_asyncio import client, config, watch

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


def phases_seen(pod: Any) -> set[str]:
    seen = set()
    if pod.spec.node_name:
        seen.add("scheduled")
    for status in pod.status.container_statuses or ():
        if status.state and status.state.running:
            seen.add("started")
    for condition in pod.status.conditions or ():
        if condition.type == "Ready" and condition.status == "True":
            seen.add("ready")
    return seen


async def one_pod(core: Any, namespace: str, name: str, limit_s: float = 120) -> dict[str, float]:
    """Create one Pod and time its phases from a watch opened before the create; then delete it."""
    stamps: dict[str, float] = {}
    opened = asyncio.Event()

    async def observe() -> None:
        stream = watch.Watch()
        async with stream:
            opened.set()
            async for event in stream.stream(
                core.list_namespaced_pod,
                namespace,
                field_selector=f"metadata.name={name}",
                timeout_seconds=int(limit_s),
            ):
                now = time.monotonic()
                for phase in phases_seen(event["object"]):
                    stamps.setdefault(phase, now)
                if "ready" in stamps:
                    return

    watcher = asyncio.create_task(observe())
    await opened.wait()
    await asyncio.sleep(0.05)  # the watch request is on the wire before the Pod exists
    started = time.monotonic()
    await core.create_namespaced_pod(namespace, pod_manifest(name))
    created = time.monotonic()
    try:
        await asyncio.wait_for(watcher, limit_s)
    except TimeoutError:
        raise SystemExit(
            f"pod {name} not Ready after {limit_s:.0f}s (phases seen: {sorted(stamps)})"
        ) from None
    result = {"create_call": created - started}
    result.update({phase: stamps[phase] - started for phase in PHASES if phase in stamps})
    deleting = time.monotonic()
    # Not 0: that removes the object at once and the sandbox's teardown would overlap the next
    # measurement; with 1 the kubelet removes it only once the containers are gone.
    await core.delete_namespaced_pod(name, namespace, grace_period_seconds=1)
    while True:
        try:
            await core.read_namespaced_pod(name, namespace)
        except client.ApiException as error:
            if error.status == 404:
                break
            raise
        await asyncio.sleep(0.1)
    result["deleted"] = time.monotonic() - deleting
    return result


async def run(count: int, kubeconfig: Path) -> dict[str, Any]:
    await config.load_kube_config(config_file=str(kubeconfig))
    async with client.ApiClient() as api:
        core = client.CoreV1Api(api)
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        # Pods need the namespace's default ServiceAccount, which the controller-manager makes.
        for _ in range(300):
            try:
                await core.read_namespaced_service_account("default", namespace)
                break
            except client.ApiException:
                await asyncio.sleep(0.1)
        log("warm-up pod (first start pays one-off page-cache misses)")
        await one_pod(core, namespace, "warmup")
        samples: list[dict[str, float]] = []
        for index in range(count):
            samples.append(await one_pod(core, namespace, f"sandbox-{index:03d}"))
            if (index + 1) % 5 == 0 or index + 1 == count:
                log(f"{index + 1}/{count}: last ready {samples[-1]['ready']:.2f}s")
        await core.delete_namespace(namespace)
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
