"""Benchmark: the fleet at scale: 10,000 warm sandboxes on 300 nodes, held, then 1,000 gateway clients.

Prints progress, then one JSON object as its last line. Three phases on one cluster, each with the
apiserver's own request counters (apiserver_request_total by verb and resource, read from its
/metrics with the admin certificate) before and after:

1. fill: a SandboxPool of N over 3 regions, 0 -> N Ready; the fill curve, operator CPU and RSS;
2. hold: nothing changes for a while; operator CPU and RSS at rest, and the requests it still makes
   (none but its leader-lease renewals: the caches are fed by watches);
3. clients: a real gateway and C concurrent clients (the lean client of bench/rawhttp.py, over 4
   processes with a loopback address each), each leasing and releasing R times; lease latency
   p50/p99, errors, every lease id distinct and no sandbox held by two leases at once, the
   clients' own CPU beside the gateway's, while the operator replaces each released sandbox.

The full run makes its own 300-node cluster (/tmp/sandfleet-bench-scale, its own ports) and removes
it afterwards; --short does the same with 12 nodes: the apiserver's counters only speak for the fleet
on a cluster nobody else uses (on the shared test cluster other suites' lists would count too).

    .venv/bin/python bench/operator_scale.py            # full: 10,000 sandboxes, 300 nodes, 1,000 clients
    .venv/bin/python bench/operator_scale.py --short    # CI: 400 sandboxes, 12 nodes, 100 clients
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import rawhttp
from kubebench import (
    SCALE_CLUSTER_ENV,
    WRITE_VERBS,
    Cluster,
    Gateway,
    Operator,
    RequestCounts,
    apiserver_requests,
    lease_states,
    log,
    percentile,
    pool_manifest,
    pool_ready,
    process_cpu_seconds,
    process_rss_mb,
    request_delta,
    wait,
)
from prometheus_client.parser import text_string_to_metric_families

from sandfleet.core import api

TARGET_RSS_MB = 500
PASS_METRIC = "sandfleet_operator_reconcile_duration_seconds"
POOL = "scale"


def list_calls(delta: dict[str, int]) -> dict[str, int]:
    """The LIST requests among a phase's requests, of any client."""
    return {key: count for key, count in delta.items() if key.startswith("LIST ")}


def fleet_lists(phases: dict[str, dict[str, Any]], names: tuple[str, ...]) -> dict[str, int]:
    """LISTs of the resources the operator and gateway read, in the named phases (a hot path makes none).

    Other LISTs come from the cluster itself: the LimitRanger admission plugin looks limitranges up
    live while Pods are created in a namespace it has not cached, controllers resync services.
    """
    found: dict[str, int] = {}
    for name in names:
        for key, count in phases.get(name, {}).get("lists", {}).items():
            if key.split(" ", 1)[1].split("/")[0] in (*FLEET_RESOURCES, "events"):
                found[key] = found.get(key, 0) + count
    return found


def phase_requests(before: RequestCounts, after: RequestCounts, seconds: float) -> dict[str, Any]:
    delta = request_delta(before, after)
    total = sum(delta.values())
    return {
        "seconds": round(seconds, 1),
        "requests": total,
        "requests_per_second": round(total / seconds, 1) if seconds > 0 else 0.0,
        "by_verb_resource": delta,
        "lists": list_calls(delta),
    }


def write_counts(before: RequestCounts, after: RequestCounts) -> dict[str, int]:
    """The write requests ("VERB resource" -> count) the apiserver served between two readings."""
    return {key: n for key, n in request_delta(before, after).items() if key.split(" ", 1)[0] in WRITE_VERBS}


def episode_writes(
    during: dict[str, int],
    seconds: float,
    background: dict[str, int],
    background_seconds: float,
    episodes: int,
) -> dict[str, Any]:
    """Write requests the apiserver served per leased episode, by everyone (lease, release, refill).

    `during` is counted from its own apiserver_request_total between the clients' start and the
    pool's refill (`seconds`): the gateway's claim and release patches, the operator's deletes and
    creates, the scheduler's bindings, the simulated kubelets' status writes and events. The same
    window also holds what the cluster writes with no episode at all (the simulated nodes'
    heartbeats, leader-lease renewals: the counter has no namespace or client to leave them out
    by), so that rate, measured over the idle `background` window before the clients, is taken
    off per resource: the net figure is what the episodes cost, the gross one is beside it.
    """
    rate = {key: n / background_seconds for key, n in background.items()} if background_seconds > 0 else {}
    net = {key: max(0, round(n - rate.get(key, 0.0) * seconds)) for key, n in during.items()}
    net = {key: n for key, n in net.items() if n}
    return {
        "episodes": episodes,
        "writes": sum(net.values()),
        "writes_per_episode": round(sum(net.values()) / max(episodes, 1), 2),
        "gross_writes_per_episode": round(sum(during.values()) / max(episodes, 1), 2),
        "background_writes_per_second": round(sum(rate.values()), 1),
        "by_verb_resource": dict(sorted(net.items(), key=lambda item: -item[1])),
    }


FLEET_RESOURCES = ("pods", "nodes", "sandboxpools", "sandboxprewarms", "leases", "configmaps")


def fleet_watches(open_now: RequestCounts) -> dict[str, int]:
    """Watches open on the resources the operator and gateway read (the rest are the cluster's own)."""
    return {
        f"{verb} {resource}": int(n)
        for (verb, resource), n in sorted(open_now.items())
        if verb == "WATCH" and resource in FLEET_RESOURCES and n
    }


RELEASE_ATTEMPTS = 6
ACQUIRE_ATTEMPTS = 3
# The clients run in this many processes, each connecting from a loopback address of its own: a
# thousand trainers come from many addresses, and one address past the gateway's cap of open
# connections per address (512) is refused. One process on one address measures that cap and the
# client, not the gateway: run so (with httpx), 488 of the 1,000 were refused at connect and 1,272
# acquires ended in a ReadError.
CLIENT_PROCESSES = 4


def client_process(
    url: str, token: str, clients: int, rounds: int, source: str, start_at: float, out: Any
) -> None:
    """`clients` callers, each leasing then releasing `rounds` times over a connection from `source`.

    As sandfleet.client does: an idempotency key per acquire, reused by its retries; a release
    retried while it is refused for a while. Puts what they saw, or an error.
    """
    latencies: list[float] = []
    release_latencies: list[float] = []
    errors: Counter[str] = Counter()
    held: list[tuple[str, str, float, float]] = []  # (sandbox, lease id, granted at, released at)
    pid = os.getpid()

    async def one_client(index: int, connection: rawhttp.Connection) -> None:
        for round_ in range(rounds):
            body = {"pool": POOL, "wait_seconds": 90, "idempotency_key": f"scale-{pid}-{index}-{round_}"}
            started = time.perf_counter()
            answer: Any = None
            for attempt in range(ACQUIRE_ATTEMPTS):
                try:
                    status, answer = await connection.request(
                        "POST", "/v1/leases", body, rawhttp.FRESH if attempt == 0 else None
                    )
                except (OSError, EOFError) as error:  # the retry, under the same key, adopts it
                    errors[f"acquire {type(error).__name__}"] += 1
                    answer = None
                    connection = await connection.reopen()
                    continue
                if status == 201:
                    break
                errors[f"acquire {status}"] += 1
                answer = None
                if status not in (429, 503):
                    break
                await asyncio.sleep(1)
            if answer is None:
                errors["acquires_given_up"] += 1
                continue
            granted_at = time.time()
            latencies.append((time.perf_counter() - started) * 1000)
            lease = answer["leases"][0]
            await asyncio.sleep(0)  # let others run while this one "holds" the sandbox
            released_at = time.time()
            started = time.perf_counter()
            for attempt in range(RELEASE_ATTEMPTS):
                try:
                    status, _ = await connection.request("DELETE", f"/v1/leases/{lease['id']}")
                except (OSError, EOFError) as error:
                    errors[f"release {type(error).__name__}"] += 1
                    connection = await connection.reopen()
                    continue
                if status in (200, 204):
                    release_latencies.append((time.perf_counter() - started) * 1000)
                    break
                errors[f"release {status}"] += 1
                if status not in (408, 429, 503):
                    break
                await asyncio.sleep(min(2**attempt, 10))
            else:
                errors["releases_given_up"] += 1
            held.append((lease["sandbox"], lease["id"], granted_at, released_at))

    async def run_all() -> tuple[float, float]:
        opened = await rawhttp.connections(url, token, clients, source)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        began = time.time()
        cpu = rawhttp.cpu_now()
        await asyncio.gather(*(one_client(i, c) for i, c in enumerate(opened)))
        cpu = rawhttp.cpu_now() - cpu
        await asyncio.gather(*(c.close() for c in opened), return_exceptions=True)
        return began, cpu

    try:
        began, cpu = asyncio.run(run_all())
    except Exception as error:  # the parent says what went wrong instead of waiting for a result
        out.put(f"client process {source}: {error!r}")
        return
    out.put((latencies, release_latencies, dict(errors), held, began, time.time(), cpu))


def double_leases(held: list[tuple[str, str, float, float]]) -> int:
    """Leases whose sandbox another lease held at the same time (by when each was granted and released)."""
    by_sandbox: dict[str, list[tuple[float, float]]] = {}
    for sandbox, _, granted_at, released_at in held:
        by_sandbox.setdefault(sandbox, []).append((granted_at, released_at))
    overlaps = 0
    for spans in by_sandbox.values():
        spans.sort()
        held_until = spans[0][1]
        for begin, end in spans[1:]:
            overlaps += begin < held_until  # granted while an earlier lease still held it
            held_until = max(held_until, end)
    return overlaps


def lease_and_release(url: str, token: str, clients: int, rounds: int) -> dict[str, Any]:
    """`clients` callers over CLIENT_PROCESSES processes, each leasing and releasing `rounds` times.

    What they saw, and what the clients' processes spent (the load generator's CPU, reported beside
    the gateway's).
    """
    start_at = time.time() + 5.0  # every process has its connections open by then
    shares = [clients // CLIENT_PROCESSES + (i < clients % CLIENT_PROCESSES) for i in range(CLIENT_PROCESSES)]
    results = rawhttp.in_processes(
        client_process,
        [(url, token, share, rounds, f"127.0.0.{11 + i}", start_at) for i, share in enumerate(shares)],
        timeout=1800,
    )
    latencies = [ms for result in results for ms in result[0]]
    release_latencies = [ms for result in results for ms in result[1]]
    errors: Counter[str] = Counter()
    for result in results:
        errors.update(result[2])
    held = [lease for result in results for lease in result[3]]
    seconds = max(result[5] for result in results) - min(result[4] for result in results)
    granted = [lease_id for _, lease_id, _, _ in held]
    return {
        "clients": clients,
        "client_processes": CLIENT_PROCESSES,
        "rounds_per_client": rounds,
        "leases": len(granted),
        "seconds": round(seconds, 1),
        "cycles_per_second": round(len(granted) / seconds, 1),
        "lease_p50_ms": round(statistics.median(latencies), 1) if latencies else 0.0,
        "lease_p99_ms": round(percentile(latencies, 99), 1),
        "lease_max_ms": round(max(latencies, default=0.0), 1),
        "release_p50_ms": round(statistics.median(release_latencies), 1) if release_latencies else 0.0,
        "release_p99_ms": round(percentile(release_latencies, 99), 1),
        "errors": dict(errors),
        # Released sandboxes are deleted, never handed out again, so every lease id must be new.
        "duplicate_lease_ids": len(granted) - len(set(granted)),
        "concurrent_double_leases": double_leases(held),
        "client_cpu_ms_per_lease": round(
            sum(result[6] for result in results) / max(len(granted), 1) * 1000, 3
        ),
        "latencies_ms": sorted(round(v, 2) for v in latencies),
    }


def reconcile_passes(metrics_port: int) -> tuple[float, float]:
    """The operator's pool passes so far and the seconds they took, from its own /metrics histogram."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    count = total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{PASS_METRIC}_count":
                count += sample.value
            elif sample.name == f"{PASS_METRIC}_sum":
                total += sample.value
    return count, total


def pass_report(before: tuple[float, float], after: tuple[float, float]) -> dict[str, float]:
    """Passes in a phase and their mean duration (planning and applying one pool, as the operator times)."""
    passes, seconds = after[0] - before[0], after[1] - before[1]
    return {"passes": passes, "mean_pass_ms": round(1000 * seconds / passes, 2) if passes else 0.0}


def leased_pods(cluster: Cluster, namespace: str) -> int:
    return lease_states(cluster, namespace)[api.LEASE_LEASED]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--short", action="store_true", help="CI size (400 sandboxes, 12 nodes)")
    parser.add_argument("--sandboxes", type=int, default=None)
    parser.add_argument("--nodes", type=int, default=None, help="simulated nodes (300; 12 with --short)")
    parser.add_argument("--steady-seconds", type=float, default=None)
    parser.add_argument("--clients", type=int, default=None, help="concurrent gateway clients")
    parser.add_argument("--rounds", type=int, default=None, help="lease+release rounds per client")
    args = parser.parse_args()
    count = args.sandboxes or (400 if args.short else 10_000)
    steady_window = args.steady_seconds or (10.0 if args.short else 30.0)
    clients = args.clients or (100 if args.short else 1000)
    rounds = args.rounds or (2 if args.short else 3)
    nodes = args.nodes or (12 if args.short else 300)
    cluster = Cluster(separate=True, nodes=nodes, separate_env=dict(SCALE_CLUSTER_ENV))
    log("scale", f"cluster of its own, {nodes} simulated nodes; {count} sandboxes")
    cluster.up()
    namespace = ""
    phases: dict[str, dict[str, Any]] = {}
    curve: list[tuple[float, int]] = []
    try:
        namespace = cluster.namespace("bench-scale")
        with tempfile.TemporaryDirectory(prefix="sandfleet-bench-") as tmp:
            operator = Operator(cluster, namespace, Path(tmp) / "operator.log")
            log("scale", f"operator log: {operator.log_path}")
            requests_start, _ = apiserver_requests(cluster)
            start_began = time.monotonic()
            operator.start()
            time.sleep(3)  # its initial lists finish: they belong to start-up, not to the fill
            requests_before, _ = apiserver_requests(cluster)
            phases["operator_start"] = phase_requests(
                requests_start, requests_before, time.monotonic() - start_began
            )
            gateway = Gateway(cluster, namespace, Path(tmp))
            try:
                # Phase 1: fill.
                cpu_start = operator.cpu_seconds()
                passes_start = reconcile_passes(operator.metrics_port)
                started = time.monotonic()
                cluster.apply(pool_manifest(POOL, count), namespace)
                rss_samples: list[float] = []
                last_log = [0.0]

                def filled() -> bool:
                    rss_samples.append(operator.memory_mb()[0])
                    ready = pool_ready(cluster, namespace, POOL)
                    now = time.monotonic() - started
                    curve.append((round(now, 2), ready))
                    if now - last_log[0] >= 10:
                        last_log[0] = now
                        log(
                            "scale",
                            f"{ready}/{count} Ready after {now:.0f}s, operator RSS {rss_samples[-1]:.0f} MiB",
                        )
                    return ready >= count

                done = wait(filled, 180 if args.short else 1800, f"{count} sandboxes Ready", interval=1.0)
                fill_seconds = done - started
                fill_cpu = operator.cpu_seconds() - cpu_start
                passes_filled = reconcile_passes(operator.metrics_port)
                requests_filled, _ = apiserver_requests(cluster)
                hold_began = time.monotonic()
                phases["fill"] = phase_requests(requests_before, requests_filled, fill_seconds)
                log(
                    "scale",
                    f"{count} sandboxes Ready in {fill_seconds:.1f}s; operator used {fill_cpu:.1f} CPU-s",
                )
                log("scale", f"fill requests: {phases['fill']['by_verb_resource']}")

                # Phase 2: hold.
                steady_cpu_start = operator.cpu_seconds()
                time.sleep(steady_window)
                steady_cpu = operator.cpu_seconds() - steady_cpu_start
                passes_held = reconcile_passes(operator.metrics_port)
                rss_now, rss_peak = operator.memory_mb()
                requests_held, watches_open = apiserver_requests(cluster)
                hold_seconds = time.monotonic() - hold_began
                phases["hold"] = phase_requests(requests_filled, requests_held, steady_window)
                log(
                    "scale",
                    f"steady: RSS {rss_now:.0f} MiB (peak {rss_peak:.0f}), "
                    f"{steady_cpu / steady_window:.3f} cores; requests {phases['hold']['by_verb_resource']}",
                )

                # Phase 3: a gateway and many clients leasing and releasing.
                gateway_began = time.monotonic()
                gateway.start()
                log("scale", f"gateway ready; {clients} clients x {rounds} lease+release rounds")
                requests_gw_before, _ = apiserver_requests(cluster)
                episodes_began = time.monotonic()
                phases["gateway_start"] = phase_requests(
                    requests_held, requests_gw_before, time.monotonic() - gateway_began
                )
                load_before = os.getloadavg()[0]
                gateway_cpu_start = process_cpu_seconds(gateway.pid)
                operator_cpu_gw_start = operator.cpu_seconds()
                client_report = lease_and_release(gateway.url, gateway.token, clients, rounds)
                gateway_cpu = process_cpu_seconds(gateway.pid) - gateway_cpu_start
                operator_cpu_gw = operator.cpu_seconds() - operator_cpu_gw_start
                gateway_rss = process_rss_mb(gateway.pid)
                load_after = os.getloadavg()[0]
                requests_gw_after, watches_gw = apiserver_requests(cluster)
                phases["clients"] = phase_requests(
                    requests_gw_before, requests_gw_after, client_report["seconds"]
                )
                still_leased = leased_pods(cluster, namespace)
                log(
                    "scale",
                    f"clients: {client_report['leases']} leases in {client_report['seconds']}s, "
                    f"p50 {client_report['lease_p50_ms']} ms, p99 {client_report['lease_p99_ms']} ms, "
                    f"errors {client_report['errors']}, duplicates {client_report['duplicate_lease_ids']}; "
                    f"requests {phases['clients']['by_verb_resource']}",
                )
                # The pool returns to its target once the operator has replaced every released one.
                refill_started = time.monotonic()
                refilled = wait(
                    lambda: pool_ready(cluster, namespace, POOL) >= count,
                    180 if args.short else 900,
                    "the pool to refill after the clients",
                    interval=1.0,
                )
                refill_seconds = refilled - refill_started
                requests_refilled, _ = apiserver_requests(cluster)
                writes = episode_writes(
                    write_counts(requests_gw_before, requests_refilled),
                    time.monotonic() - episodes_began,
                    write_counts(requests_filled, requests_held),
                    hold_seconds,
                    client_report["leases"],
                )
                log(
                    "scale",
                    f"{writes['writes_per_episode']} apiserver writes per episode (lease, release, refill), "
                    f"{writes['gross_writes_per_episode']} before the cluster's own writes when idle "
                    f"({writes['background_writes_per_second']}/s) are taken off: "
                    f"{writes['by_verb_resource']}",
                )
                _, final_peak = operator.memory_mb()
            except SystemExit:
                log("scale", "operator log tail:\n" + operator.log_path.read_text(errors="replace")[-3000:])
                if gateway.log_path.exists():
                    log("scale", "gateway log tail:\n" + gateway.log_path.read_text(errors="replace")[-3000:])
                raise
            finally:
                gateway.stop()
                operator.stop()
    finally:
        cluster.cleanup(namespace)
    latencies = client_report.pop("latencies_ms")
    peak = max(rss_peak, final_peak, *rss_samples)
    # Start-ups list once, then watch; the fill, the hold and the clients are the hot paths.
    hot_lists = fleet_lists(phases, ("fill", "hold", "clients"))
    print(
        json.dumps(
            {
                "benchmark": "operator_scale",
                "mode": "short" if args.short else "full",
                "sandboxes": count,
                "regions": 3,
                "nodes": nodes,
                "fill_seconds": round(fill_seconds, 1),
                "fill_sandboxes_per_second": round(count / fill_seconds, 1),
                "fill_curve": thin(curve, 200),
                "operator_cpu_seconds_fill": round(fill_cpu, 1),
                "operator_cpu_cores_during_fill": round(fill_cpu / fill_seconds, 3),
                "operator_cpu_cores_steady": round(steady_cpu / steady_window, 4),
                "operator_passes_fill": pass_report(passes_start, passes_filled),
                "operator_passes_steady": pass_report(passes_filled, passes_held),
                "operator_cpu_cores_during_clients": round(operator_cpu_gw / client_report["seconds"], 3),
                "operator_rss_mb": round(rss_now, 1),
                "operator_rss_peak_mb": round(peak, 1),
                "target_rss_mb": TARGET_RSS_MB,
                "meets_target": peak <= TARGET_RSS_MB,
                "apiserver": phases,
                "apiserver_writes_per_episode": writes["writes_per_episode"],
                "apiserver_writes_per_episode_gross": writes["gross_writes_per_episode"],
                "apiserver_background_writes_per_second": writes["background_writes_per_second"],
                "apiserver_writes_per_episode_by_verb_resource": writes["by_verb_resource"],
                "watches_open": fleet_watches(watches_gw),
                "watches_open_before_gateway": fleet_watches(watches_open),
                "load_average_1m": {
                    "before_clients": round(load_before, 2),
                    "after_clients": round(load_after, 2),
                },
                "lists_on_hot_paths": hot_lists,
                "gateway": {
                    **client_report,
                    "gateway_cpu_ms_per_lease": round(
                        gateway_cpu / max(client_report["leases"], 1) * 1000, 2
                    ),
                    "gateway_rss_mb": round(gateway_rss, 1),
                    "leased_pods_after": still_leased,
                    "pool_refill_seconds": round(refill_seconds, 1),
                },
                "lease_latencies_ms": thin_values(latencies, 2000),
            }
        )
    )


def thin(points: list[tuple[float, int]], most: int) -> list[tuple[float, int]]:
    """At most `most` points of a curve, evenly spaced, keeping the last."""
    if len(points) <= most:
        return points
    step = len(points) / most
    picked = [points[int(i * step)] for i in range(most)]
    return [*picked[:-1], points[-1]]


def thin_values(values: list[float], most: int) -> list[float]:
    """At most `most` values of a sorted sample, evenly spaced quantiles (keeps the shape for a plot)."""
    if len(values) <= most:
        return values
    step = (len(values) - 1) / (most - 1)
    return [values[round(i * step)] for i in range(most)]


if __name__ == "__main__":
    main()
