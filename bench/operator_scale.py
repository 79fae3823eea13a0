"""Benchmark: operator memory and CPU while it fills and then holds 10,000 warm sandboxes on 300 nodes.

Prints progress, then one JSON object as its last line. The full run makes its own 300-node cluster
(/tmp/sandfleet-bench, other ports) and removes it afterwards; --short reuses the shared test cluster
without resizing it.

    .venv/bin/python bench/operator_scale.py            # full: 10,000 sandboxes, 300 simulated nodes
    .venv/bin/python bench/operator_scale.py --short    # CI: 400 sandboxes on the shared cluster
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from kubebench import Cluster, Operator, log, pool_manifest, pool_ready, wait

TARGET_RSS_MB = 500


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--short", action="store_true", help="CI size on the shared cluster")
    parser.add_argument("--sandboxes", type=int, default=None)
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--steady-seconds", type=float, default=None)
    args = parser.parse_args()
    count = args.sandboxes or (400 if args.short else 10_000)
    steady_window = args.steady_seconds or (10.0 if args.short else 30.0)
    cluster = Cluster(separate=not args.short, nodes=args.nodes)
    log("scale", f"cluster: {'shared' if args.short else f'separate, {args.nodes} nodes'}; {count} sandboxes")
    cluster.up()
    namespace = ""
    try:
        namespace = cluster.namespace("bench-scale")
        with tempfile.TemporaryDirectory(prefix="sandfleet-bench-") as tmp:
            operator = Operator(cluster, namespace, Path(tmp) / "operator.log")
            log("scale", f"operator log: {operator.log_path}")
            operator.start()
            try:
                cpu_start = operator.cpu_seconds()
                started = time.monotonic()
                cluster.apply(pool_manifest("scale", count), namespace)
                rss_samples: list[float] = []

                def filled() -> bool:
                    rss_samples.append(operator.memory_mb()[0])
                    return pool_ready(cluster, namespace, "scale") >= count

                done = wait(filled, 120 if args.short else 1800, f"{count} sandboxes Ready", interval=1.0)
                fill_seconds = done - started
                fill_cpu = operator.cpu_seconds() - cpu_start
                log(
                    "scale",
                    f"{count} sandboxes Ready in {fill_seconds:.1f}s; operator used {fill_cpu:.1f} CPU-s",
                )
                steady_cpu_start = operator.cpu_seconds()
                time.sleep(steady_window)
                steady_cpu = operator.cpu_seconds() - steady_cpu_start
                rss_now, rss_peak = operator.memory_mb()
                log(
                    "scale",
                    f"steady: RSS {rss_now:.0f} MiB (peak {rss_peak:.0f}), "
                    f"{steady_cpu / steady_window:.3f} cores",
                )
            except SystemExit:
                log("scale", "operator log tail:\n" + operator.log_path.read_text(errors="replace")[-3000:])
                raise
            finally:
                operator.stop()
    finally:
        cluster.cleanup(namespace)
    print(
        json.dumps(
            {
                "benchmark": "operator_scale",
                "mode": "short" if args.short else "full",
                "sandboxes": count,
                "nodes": args.nodes if not args.short else "shared",
                "fill_seconds": round(fill_seconds, 1),
                "fill_sandboxes_per_second": round(count / fill_seconds, 1),
                "operator_cpu_cores_during_fill": round(fill_cpu / fill_seconds, 3),
                "operator_cpu_cores_steady": round(steady_cpu / steady_window, 4),
                "operator_rss_mb": round(rss_now, 1),
                "operator_rss_peak_mb": round(max(rss_peak, *rss_samples), 1),
                "target_rss_mb": TARGET_RSS_MB,
                "meets_target": max(rss_peak, rss_now) <= TARGET_RSS_MB,
            }
        )
    )


if __name__ == "__main__":
    main()
