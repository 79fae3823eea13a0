"""Benchmark: fill a SandboxPool from 0 over 3 regions, against a ReplicaSet of as many Pods, same cluster.

Prints progress, then one JSON object as its last line. The full run makes its own cluster (60
simulated nodes, /tmp/sandfleet-bench, other ports) and removes it afterwards; --short reuses the
shared test cluster without resizing it.

    .venv/bin/python bench/pool_fill.py            # full: 3,000 sandboxes, separate 60-node cluster
    .venv/bin/python bench/pool_fill.py --short    # CI: 150 sandboxes on the shared cluster
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from kubebench import IMAGE, Cluster, Operator, log, pool_manifest, wait

TARGET_RATIO = 0.8


def replicaset(replicas: int) -> dict[str, Any]:
    """Pods as close to the operator's sandboxes as a ReplicaSet allows (same image, runtime, probe)."""
    labels = {"app": "rs-baseline"}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "baseline"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "runtimeClassName": "gvisor",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "containers": [
                        {
                            "name": "sandbox",
                            "image": IMAGE,
                            "imagePullPolicy": "Never",
                            "ports": [{"name": "agent", "containerPort": 8000}],
                            "readinessProbe": {
                                "httpGet": {"path": "/v1/ready", "port": 8000},
                                "periodSeconds": 1,
                            },
                        }
                    ],
                },
            },
        },
    }


Curve = list[tuple[float, int]]
POOL_LABEL = "sandfleet.dev/pool"
READY = "jsonpath={range .items[*]}{.status.conditions[?(@.type=='Ready')].status}{' '}{end}"


def ready_pods(cluster: Cluster, namespace: str, selector: str) -> int:
    """Pods with the label `selector` whose Ready condition is True (the same count for both)."""
    return cluster.kubectl("-n", namespace, "get", "pods", "-l", selector, "-o", READY).split().count("True")


def fill_replicaset(cluster: Cluster, namespace: str, count: int, timeout: float, curve: Curve) -> float:
    started = time.monotonic()
    cluster.apply(replicaset(count), namespace)

    def ready() -> bool:
        now = ready_pods(cluster, namespace, "app=rs-baseline")
        curve.append((round(time.monotonic() - started, 2), now))
        return now >= count

    done = wait(ready, timeout, f"the ReplicaSet's {count} Pods to be Ready")
    seconds = done - started
    cluster.kubectl("-n", namespace, "delete", "rs", "baseline", "--wait=false")
    wait(lambda: cluster.count_pods(namespace) == 0, timeout, "the ReplicaSet's Pods to go", interval=1.0)
    return seconds


def fill_pool(
    cluster: Cluster, namespace: str, count: int, timeout: float, workdir: Path, curve: Curve
) -> tuple[float, float]:
    operator = Operator(cluster, namespace, workdir / "operator.log")
    operator.start()
    try:
        cpu_before = operator.cpu_seconds()
        started = time.monotonic()
        cluster.apply(pool_manifest("fill", count), namespace)

        def ready() -> bool:
            # Ready Pods counted directly, as for the ReplicaSet: the pool's status is written by the
            # operator now and then, and under load it trails the Pods by many seconds.
            now = ready_pods(cluster, namespace, f"{POOL_LABEL}=fill")
            curve.append((round(time.monotonic() - started, 2), now))
            return now >= count

        done = wait(ready, timeout, f"the pool's {count} sandboxes to be Ready")
        return done - started, operator.cpu_seconds() - cpu_before
    except SystemExit:
        log("fill", "operator log tail:\n" + operator.log_path.read_text(errors="replace")[-3000:])
        raise
    finally:
        operator.stop()


def thin_curve(points: Curve, most: int = 200) -> Curve:
    """At most `most` points of a fill curve, evenly spaced, keeping the last."""
    if len(points) <= most:
        return points
    step = len(points) / most
    return [*(points[int(i * step)] for i in range(most - 1)), points[-1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--short", action="store_true", help="CI size on the shared cluster")
    parser.add_argument("--sandboxes", type=int, default=None)
    parser.add_argument("--nodes", type=int, default=60, help="nodes of the separate cluster (full run)")
    args = parser.parse_args()
    count = args.sandboxes or (150 if args.short else 3000)
    cluster = Cluster(separate=not args.short, nodes=args.nodes)
    log("fill", f"cluster: {'shared' if args.short else f'separate, {args.nodes} nodes'}; {count} sandboxes")
    cluster.up()
    timeout = 120 if args.short else 900
    namespace = ""
    pool_curve: Curve = []
    rs_curve: Curve = []
    try:
        namespace = cluster.namespace("bench-fill")
        with tempfile.TemporaryDirectory(prefix="sandfleet-bench-") as tmp:
            rs_seconds = fill_replicaset(cluster, namespace, count, timeout, rs_curve)
            log("fill", f"ReplicaSet: {count} Pods Ready in {rs_seconds:.1f}s")
            pool_seconds, cpu = fill_pool(cluster, namespace, count, timeout, Path(tmp), pool_curve)
            log(
                "fill",
                f"SandboxPool: {count} sandboxes Ready in {pool_seconds:.1f}s ({cpu:.1f} CPU-s operator)",
            )
    finally:
        cluster.cleanup(namespace)
    pool_rate, rs_rate = count / pool_seconds, count / rs_seconds
    print(
        json.dumps(
            {
                "benchmark": "pool_fill",
                "mode": "short" if args.short else "full",
                "sandboxes": count,
                "regions": 3,
                "cluster": "shared" if args.short else f"separate-{args.nodes}-nodes",
                "pool_seconds": round(pool_seconds, 2),
                "pool_sandboxes_per_second": round(pool_rate, 1),
                "replicaset_seconds": round(rs_seconds, 2),
                "replicaset_pods_per_second": round(rs_rate, 1),
                "ratio_to_replicaset": round(pool_rate / rs_rate, 3),
                "target_ratio": TARGET_RATIO,
                "meets_target": pool_rate / rs_rate >= TARGET_RATIO,
                "operator_cpu_seconds": round(cpu, 2),
                "fill_curves": {"SandboxPool": thin_curve(pool_curve), "ReplicaSet": thin_curve(rs_curve)},
            }
        )
    )


if __name__ == "__main__":
    main()
