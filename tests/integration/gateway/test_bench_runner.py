"""bench/run: one command for every benchmark; its JSON, plots and the generated section of the report.

The short mode of the benchmarks that have no CI test of their own (the scale run with its 100
gateway clients, the RL loop, the reward attacks) runs here through the runner; the others' short
modes run in their own suites (tests/e2e/local, tests/integration/*/test_benchmarks.py).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
RUN = REPO / "bench" / "run"
SVG = "{http://www.w3.org/2000/svg}"
# Rows the runner checks: PRODUCT.md's table, burst p50 and p99 apart, first exec twice, the batch
# at the gateway and the client, 4,096 at once, writes per episode with and without recycling, and
# the ledger's burst against the Pod store's, over 3 gateways and their throughput against 1 (on
# the shared cores, and each with a CPU quota of its own), and the time to score in gVisor over the
# host's, median and p90 over the catalogue.
PRODUCT_TARGETS = 21


def run_bench(*args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RUN), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


def bench_module(name: str) -> ModuleType:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REPO / "bench"))


def bench_runner() -> ModuleType:
    return bench_module("runner")


def synthetic_results() -> dict[str, Any]:
    def entry(name: str, *runs: dict[str, Any]) -> dict[str, Any]:
        stamped = [{**r, "_wall_seconds": 1.0, "_load_average_1m": [0.5, 0.6]} for r in runs]
        return {"script": f"{name}.py", "command": f".venv/bin/python bench/{name}.py", "what": name,
                "runs": stamped, "status": "ok"}  # fmt: skip

    def carried_over(name: str, *runs: dict[str, Any]) -> dict[str, Any]:
        older = {"generated_at": "2025-12-01 09:00 UTC", "machine": {"nproc": 2, "cpu_model": "an older cpu"}}
        carried: dict[str, Any] | None = bench_runner().carried(
            {**older, "benchmarks": {name: entry(name, *runs)}}, name
        )
        assert carried is not None
        return carried

    return {
        "generated_at": "2026-01-01 00:00 UTC",
        "mode": "full",
        "machine": {
            "nproc": 2,
            "memory_gib": 23.0,
            "kernel": "6.x",
            "cpu_model": "cpu",
            "os": "os",
            "python": "3.11",
        },
        "load_average_start": 1.0,
        "benchmarks": {
            "sandbox_cold": carried_over(
                "sandbox_cold",
                {
                    "cold_ready_p50_s": 0.3,
                    "cold_ready_p99_s": 0.5,
                    "warm_first_exec_p50_s": 0.016,
                    "warm_first_exec_p99_s": 0.04,
                    "samples_ms": {"cold": [300.0, 320.0, 500.0]},
                },
                {
                    "cold_ready_p50_s": 0.5,
                    "cold_ready_p99_s": 0.7,
                    "warm_first_exec_p50_s": 0.018,
                    "warm_first_exec_p99_s": 0.05,
                    "samples_ms": {"cold": [310.0, 330.0, 700.0]},
                },
            ),
            "gateway_leases": entry(
                "gateway_leases",
                {
                    "warm_lease_burst_p50_ms": 2000.0,
                    "warm_lease_burst_p99_ms": 4000.0,
                    "lease_release_cycles_per_s": 90.0,
                    "first_exec_from_warm_lease_p50_ms": 17.0,
                    "exec_true_via_gateway_p50_ms": 3.0,
                    "exec_true_via_gateway_p99_ms": 10.0,
                    "samples_ms": {"warm lease in a 300 burst": [900.0, 2000.0, 4000.0]},
                },
            ),
            "pool_fill": entry(
                "pool_fill",
                {
                    "ratio_to_replicaset": 0.96,
                    "sandboxes": 3000,
                    "fill_curves": {
                        "SandboxPool": [[0, 0], [10, 1500], [38, 3000]],
                        "ReplicaSet": [[0, 0], [37, 3000]],
                    },
                },
            ),
            "gateway_replicas": entry(
                "gateway_replicas",
                {
                    "burst_size": 300,
                    "repeats": 3,
                    "configs": {
                        "pod store, 1 gateway": {"p50_ms": 3000.0, "leases_per_s": 60.0},
                        "ledger, 1 gateway": {"p50_ms": 200.0, "leases_per_s": 500.0},
                    },
                    "burst_p50_ledger_over_pod": 0.067,
                },
            ),
            "lease_batches": entry(
                "lease_batches",
                {
                    "batch_size": 300,
                    "batch_pod": {"lease_writes_per_lease": 2.0},
                    "batch_ledger": {"lease_writes_per_lease": 0.03},
                    "batch_client_p50_ms": 60.0,
                    "sustained_writes_per_episode": 0.05,
                },
            ),
            "real_node_pods": {
                "script": "real_node_pods.py",
                "command": "c",
                "what": "w",
                "runs": [],
                "status": "not available",
                "error": "bench/real_node_pods.py does not exist yet",
            },
        },
    }


def test_the_report_section_is_regenerated_from_the_json_and_the_prose_kept(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    results.write_text(json.dumps(synthetic_results()))
    docs = tmp_path / "benchmarks.md"
    docs.write_text(
        "# Benchmarks\n\nHand-written: why the burst is slow.\n\n"
        "<!-- BEGIN GENERATED by bench/run: edit bench/runner.py, not this section -->\nstale\n"
        "<!-- END GENERATED by bench/run -->\n\nHand-written afterword.\n"
    )
    out = tmp_path / "out"
    result = run_bench("--render", str(results), "--out", str(out), "--docs", str(docs), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    text = docs.read_text()
    # The benchmark carried over from an older report (synthetic_results) says when and on what it ran.
    assert "Measured 2025-12-01 09:00 UTC or earlier on 2 CPUs (an older cpu)." in text
    assert "Hand-written: why the burst is slow." in text
    assert "Hand-written afterword." in text
    assert "stale" not in text
    rendered = json.loads((out / "results.json").read_text())
    rows = rendered["targets"]
    assert len(rows) == PRODUCT_TARGETS
    by_field = {row["field"]: row for row in rows}
    # Medians over runs, and the range of the runs.
    assert by_field["cold_ready_p50_s"]["measured"] == pytest.approx(0.4)
    assert by_field["cold_ready_p50_s"]["range"] == [0.3, 0.5]
    assert by_field["warm_first_exec_p50_s"]["measured"] == pytest.approx(17.0)  # s -> ms
    assert by_field["warm_lease_burst_p50_ms"]["met"] is False
    assert by_field["ratio_to_replicaset"]["met"] is True
    assert by_field["burst_p50_ledger_over_pod"]["met"] is True  # 0.067 <= 0.1
    assert by_field["sustained_writes_per_episode"]["met"] is True
    assert by_field["ready_p50_s"]["met"] is None  # real_node_pods: not available, not a failure
    assert "not measured: not available" in text
    assert "| warm lease, 300-lease burst, real apiserver, p50 | <= 10 ms | **2,000 ms** |" in text
    assert (tmp_path / "benchmarks" / "results.json").exists()
    for plot, series in (
        ("latency-local.svg", "cold (n="),
        ("latency-gateway.svg", "warm lease in a 300 burst (n="),
        ("fill-pool-vs-replicaset.svg", "SandboxPool, 3000 (3000 at 38)"),
        ("lease-store-burst.svg", "ledger, 1 gateway"),
        ("lease-store-writes.svg", "batch of 300, pod store: acquire + release, per lease"),
    ):
        root = ET.parse(tmp_path / "benchmarks" / plot).getroot()
        assert root.tag == f"{SVG}svg", plot
        texts = " | ".join("".join(t.itertext()) for t in root.iter(f"{SVG}text"))
        assert series in texts, plot  # the legend names each line drawn
        assert f"benchmarks/{plot}" in text


@pytest.mark.cluster
@pytest.mark.gvisor
def test_the_scale_run_counts_a_sandbox_held_by_two_leases_at_once() -> None:
    double_leases = bench_module("operator_scale").double_leases
    # (sandbox, lease id, granted at, released at), from any of the client processes, in any order
    one_after_another = [("a", "l1", 1.0, 2.0), ("a", "l2", 2.0, 3.0), ("b", "l3", 1.5, 2.5)]
    assert double_leases(one_after_another) == 0
    assert double_leases([("a", "l2", 1.5, 2.5), *one_after_another]) == 2  # overlaps l1, then l2
    # within a long hold: each of the later two, though they do not overlap each other
    assert double_leases([("c", "l4", 5.0, 9.0), ("c", "l5", 6.0, 7.0), ("c", "l6", 8.0, 8.5)]) == 2
    assert double_leases([]) == 0


def test_short_mode_through_the_runner(tmp_path: Path) -> None:
    only = "operator_scale,rl_loop,reward_attacks"
    result = run_bench("--short", "--only", only, "--out", str(tmp_path), "--no-docs")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "rl_loop: ok" in result.stderr  # progress is printed as it goes
    assert "operator_scale: ok" in result.stderr
    assert "reward_attacks: ok" in result.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["mode"] == "short"
    # 400 sandboxes say nothing about the 10,000 target: not counted as met.
    scale_row = next(row for row in results["targets"] if row["field"] == "operator_rss_peak_mb")
    assert scale_row["met"] is None
    assert results["machine"]["nproc"] >= 1
    # The short attack set: under a test command's own report some pay, under the named tests none.
    (attacks,) = results["benchmarks"]["reward_attacks"]["runs"]
    assert attacks["attacks_paid_before"] > 0
    assert attacks["attacks_paid_after"] == 0
    assert attacks["score_seconds"]["task"]["p50_s"] > 0
    scale = results["benchmarks"]["operator_scale"]["runs"][0]
    assert scale["sandboxes"] == 400
    assert 0 < scale["operator_rss_mb"] <= scale["operator_rss_peak_mb"]
    assert scale["operator_cpu_cores_steady"] >= 0
    # A list per sandbox or per lease would be hundreds here. A watch that breaks under load (its
    # deadline passes on a starved machine) recovers with one relist: that is allowed, once or twice.
    lists = scale["lists_on_hot_paths"]
    assert all(count <= 2 for count in lists.values()), f"a hot path listed instead of watching: {lists}"
    assert scale["apiserver"]["clients"]["requests"] > 0
    gateway = scale["gateway"]
    assert gateway["leases"] == gateway["clients"] * gateway["rounds_per_client"]
    # The clients are several processes, each from a loopback address of its own, and their CPU is
    # reported beside the gateway's: the load generator is not what is measured.
    assert gateway["client_processes"] > 1
    assert gateway["client_cpu_ms_per_lease"] > 0
    assert gateway["duplicate_lease_ids"] == 0
    assert gateway["concurrent_double_leases"] == 0
    assert gateway["errors"] == {}
    assert 0 < gateway["lease_p50_ms"] <= gateway["lease_p99_ms"]
    assert scale["fill_curve"][-1][1] >= 400
    # A Pod per episode: the operator's delete and the replacement's create, counted by the
    # apiserver (docs/gateway.md: never fewer than ~4). The leases go to the ledger, in batches of
    # what arrives while a shard's write is out: fewer than the Pod store's 2 patches per episode
    # even with these clients, which lease one sandbox at a time.
    writes = scale["apiserver_writes_per_episode_by_verb_resource"]  # totals over the episodes
    assert {"DELETE pods", "POST pods"} <= set(writes), writes
    assert "PATCH pods" not in writes, writes  # no lease is written on a Pod
    assert 0 < writes["PATCH sandboxledgers"] <= 1.25 * gateway["leases"], writes
    assert scale["apiserver_writes_per_episode"] >= 4, writes
    # The simulated nodes' heartbeats go on with no episode at all: measured idle, and taken off.
    assert scale["apiserver_background_writes_per_second"] > 0
    assert scale["apiserver_writes_per_episode_gross"] > scale["apiserver_writes_per_episode"]
    rl = results["benchmarks"]["rl_loop"]["runs"][0]
    assert rl["episodes"] > 0
    assert rl["profile"]["verdict"]["bottleneck"]
    for plot in ("fill-scale.svg", "latency-gateway.svg", "loop-profile.svg", "writes-per-episode.svg"):
        assert ET.parse(tmp_path / plot).getroot().tag == f"{SVG}svg", plot
