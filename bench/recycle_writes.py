"""Benchmark: apiserver writes per episode on the real gVisor node, a recycling pool beside one without.

Installs the chart on the real-node cluster of the e2e tests (its own state dir and ports; started
if it is not running, and stopped again unless --keep) with two pools of the base sandbox image,
both keeping their leases in the lease ledger (the default): `fresh` (every released Pod is deleted
and replaced) and `recycled` (`recycle`: the agent resets the Pod and the run's next lease gets it
back). One pool holds Pods at a time, the other scaled to 0: two pools of 16 and their
replacements, 32 gVisor sandboxes on two cores, missed their readiness probes (load average near
80), and a pool churning beside the one being counted would be counted with it.

For each pool, rounds of one RL step each go through the chart's gateway: a batch of `--batch`
episodes of one run (one batch acquire, one exec in each sandbox, one release of the run), and
each round is counted from the apiserver's own `apiserver_request_total` from its acquire until
the pool has settled again (the replacement Pods of `fresh` created, bound and Ready). The
cluster's idle writes (node and gateway heartbeats, measured over a quiet window before each pool)
are subtracted at their rate. The gateways' own reset counters show how the recycled pool's resets
ended (a failed reset deletes the Pod, which would show here as Pod creates).

    .venv/bin/python bench/recycle_writes.py                 # 3 rounds of an 8-episode step per pool
    .venv/bin/python bench/recycle_writes.py --batch 4       # quicker

Prints progress and a summary on stderr, then one JSON object as the last line of stdout (and,
with --json FILE, into FILE).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kubebench import WRITE_VERBS, RequestCounts, request_delta

from sandfleet.client import Fleet, Sandbox
from sandfleet.core import api
from sandfleet.core.ledger import ledger_from_object, overlay
from sandfleet.core.pods import sandbox_from_pod

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack"))
from localcluster.addresses import REAL_NODE_TEST_ENV  # noqa: E402

CLUSTER = REPO / "hack" / "cluster"
SANDBOX_REF = "localhost/sandfleet/sandbox:0.1.0"
POOLS = ("fresh", "recycled")
IDLE_SECONDS = 15.0
# The chart refuses a namespace without all three (podSecurity.checkNamespace).
PSA_LABELS = (
    "pod-security.kubernetes.io/enforce=baseline",
    "pod-security.kubernetes.io/warn=restricted",
    "pod-security.kubernetes.io/audit=restricted",
)


def log(message: str) -> None:
    print(f"[bench recycle_writes] {message}", file=sys.stderr, flush=True)


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 3600) -> str:
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:3])} failed:\n{result.stderr[-3000:]}")
    return result.stdout


class RealNode:
    """The e2e suites' real-node cluster, driven with hack/cluster and its own kubectl and helm."""

    def __init__(self) -> None:
        self.env = {**os.environ, **REAL_NODE_TEST_ENV}
        self.started = False
        self.kubeconfig = Path()
        self.bin_dir = Path()

    def hack(self, *args: str) -> str:
        return run([str(CLUSTER), *args], env=self.env).strip()

    def up(self) -> None:
        result = subprocess.run(
            [str(CLUSTER), "up", "--real-node", "--nodes", "0", "--gpu-nodes", "0"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=3600,
            check=False,
        )
        if result.returncode != 0:
            raise SystemExit(f"hack/cluster up --real-node failed:\n{result.stderr[-3000:]}")
        self.started = "reusing the running cluster" not in result.stderr
        self.kubeconfig = Path(self.hack("kubeconfig"))
        self.bin_dir = Path(self.hack("bin-dir"))

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        argv = [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=300, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def helm(self, namespace: str, *args: str) -> str:
        helm = Path(self.hack("bin-dir", "helm")) / "helm"
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        return run([str(helm), "--namespace", namespace, *args], env=env, timeout=900)

    def import_image(self, builder: list[str], ref: str | None = None) -> str:
        built = json.loads(run(builder).strip().splitlines()[-1])
        self.hack("import-image", built["archive"], "--ref", ref or built["ref"])
        return ref or str(built["ref"])

    def writes(self) -> RequestCounts:
        """The apiserver's counters of write requests (any resource), read with the admin identity."""
        from prometheus_client.parser import text_string_to_metric_families

        counts: RequestCounts = {}
        for family in text_string_to_metric_families(self.kubectl("get", "--raw", "/metrics")):
            for sample in family.samples:
                labels = sample.labels
                if sample.name != "apiserver_request_total" or labels.get("verb") not in WRITE_VERBS:
                    continue
                resource = "/".join(filter(None, (labels.get("resource"), labels.get("subresource"))))
                key = (labels["verb"], resource or "-")
                counts[key] = counts.get(key, 0.0) + sample.value
        return counts


def values(warm: int) -> dict[str, Any]:
    pool = {
        "image": SANDBOX_REF,
        "imagePullPolicy": "Never",
        "regions": [{"name": "us-east1"}],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
    }
    return {
        "runtimeClass": {"create": False, "name": "gvisor"},
        "operator": {"resources": {"requests": {"cpu": "50m", "memory": "128Mi"}}},
        "gateway": {"resources": {"requests": {"cpu": "50m", "memory": "128Mi"}}},
        "pools": [
            {"name": "fresh", **pool, "replicas": warm},
            # Scaled up once `fresh` is measured and scaled to 0.
            {"name": "recycled", **pool, "replicas": 0, "recycle": {"maxEpisodes": 1000, "maxSeconds": 3600}},
        ],
    }


def pool_pods(node: RealNode, namespace: str, pool: str) -> list[dict[str, Any]]:
    listed = json.loads(
        node.kubectl("-n", namespace, "get", "pods", "-l", f"{api.POOL_LABEL}={pool}", "-o", "json")
    )
    return list(listed["items"])


def unsettled(node: RealNode, namespace: str, pool: str, warm: int) -> str:
    """Why the pool is not settled yet ("" once every Pod is Ready, none going, its warm target free)."""
    pods = pool_pods(node, namespace, pool)
    ledgers = json.loads(node.kubectl("-n", namespace, "get", api.LEDGER_PLURAL, "-o", "json"))
    entries = {}
    for obj in ledgers["items"]:
        ledger = ledger_from_object(obj)
        entries[ledger.shard] = ledger.entries
    free = going = unready = 0
    for pod in pods:
        sandbox = sandbox_from_pod(pod)
        if sandbox is None or sandbox.terminating:
            going += 1
            continue
        if not sandbox.ready:
            unready += 1
            continue
        if sandbox.shard is not None:
            sandbox = overlay(sandbox, entries.get(sandbox.shard, {}).get(sandbox.name))
        free += sandbox.free
    if going or unready or free < warm:
        return f"{len(pods)} Pods: {going} going, {unready} not Ready, {free} free of {warm} wanted"
    return ""


def wait_settled(node: RealNode, namespace: str, pool: str, warm: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while reason := unsettled(node, namespace, pool, warm):
        if time.monotonic() > deadline:
            raise SystemExit(f"pool {pool} did not settle within {timeout:.0f} s: {reason}")
        time.sleep(0.5)


def scale(node: RealNode, namespace: str, pool: str, replicas: int) -> None:
    patch = json.dumps({"spec": {"replicas": replicas}})
    node.kubectl("-n", namespace, "patch", "sandboxpool", pool, "--type", "merge", "-p", patch)


def wait_empty(node: RealNode, namespace: str, pool: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while pool_pods(node, namespace, pool):
        if time.monotonic() > deadline:
            raise SystemExit(f"pool {pool} still has Pods {timeout:.0f} s after scaling to 0")
        time.sleep(1)


def reset_outcomes(node: RealNode, namespace: str, pool: str) -> dict[str, float]:
    """The pool's resets by outcome, summed over the gateway replicas' own counters."""
    from prometheus_client.parser import text_string_to_metric_families

    gateways = json.loads(
        node.kubectl(
            "-n", namespace, "get", "pods", "-l", "app.kubernetes.io/component=gateway", "-o", "json"
        )
    )
    outcomes: dict[str, float] = {}
    for pod in gateways["items"]:
        port = pod["spec"]["containers"][0]["ports"][0]["containerPort"]
        path = f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}:{port}/proxy/metrics"
        for family in text_string_to_metric_families(node.kubectl("get", "--raw", path)):
            for sample in family.samples:
                if sample.name == "sandfleet_sandbox_resets_total" and sample.labels.get("pool") == pool:
                    result = sample.labels["result"]
                    outcomes[result] = outcomes.get(result, 0.0) + sample.value
    return outcomes


def event_counts(node: RealNode, namespace: str) -> dict[str, tuple[str, int]]:
    """Each Event of the namespace by uid: its component and reason, and how often it happened."""
    listed = json.loads(node.kubectl("-n", namespace, "get", "events", "-o", "json"))
    counts = {}
    for event in listed["items"]:
        series = event.get("series") or {}
        count = int(series.get("count") or event.get("count") or 1)
        source = (event.get("source") or {}).get("component") or event.get("reportingComponent") or "?"
        counts[event["metadata"]["uid"]] = (f"{source} {event.get('reason')}", count)
    return counts


def events_between(before: dict[str, tuple[str, int]], after: dict[str, tuple[str, int]]) -> dict[str, int]:
    """What happened between two snapshots, by component and reason (each count's growth)."""
    grown: dict[str, int] = {}
    for uid, (reason, count) in after.items():
        delta = count - before.get(uid, (reason, 0))[1]
        if delta > 0:
            grown[reason] = grown.get(reason, 0) + delta
    return dict(sorted(grown.items(), key=lambda item: -item[1]))


def total(delta: dict[str, int]) -> int:
    return sum(delta.values())


def measure_pool(
    node: RealNode, fleet: Fleet, namespace: str, pool: str, batch: int, rounds: int
) -> dict[str, Any]:
    wait_settled(node, namespace, pool, batch)
    before, started = node.writes(), time.monotonic()
    time.sleep(IDLE_SECONDS)
    idle_rate = total(request_delta(before, node.writes())) / (time.monotonic() - started)
    log(f"{pool}: the cluster idles at {idle_rate:.2f} writes/s")
    per_round: list[dict[str, Any]] = []
    # The release of a recycling pool's episode waits for the reset: its extra time is the reset's.
    acquire_seconds: list[float] = []
    release_seconds: list[float] = []
    run = f"bench-{pool}"
    names: set[str] = set()
    for index in range(rounds):
        events_before = event_counts(node, namespace)
        before, started = node.writes(), time.monotonic()
        leased = time.monotonic()
        leases = fleet.acquire(pool, count=batch, min_count=batch, labels={"run": run}, wait_seconds=120)
        acquire_seconds.append(time.monotonic() - leased)
        names |= {lease.sandbox for lease in leases}
        for lease in leases:
            assert Sandbox(fleet, lease).exec(["true"]).exit_code == 0
        released = time.monotonic()
        assert len(fleet.release_run(run)) == batch
        release_seconds.append(time.monotonic() - released)
        wait_settled(node, namespace, pool, batch)
        seconds = time.monotonic() - started
        delta = request_delta(before, node.writes())
        net = total(delta) - idle_rate * seconds
        events = events_between(events_before, event_counts(node, namespace))
        per_round.append(
            {
                "writes_per_episode": round(net / batch, 3),
                "gross_writes": total(delta),
                "seconds": round(seconds, 1),
                "pods_used": len(names),
                "writes": delta,
                "events": events,
            }
        )
        log(
            f"{pool} round {index + 1}/{rounds}: {net / batch:.3f} writes per episode net, "
            f"{len(names)} Pods so far, {seconds:.1f} s; events {events}"
        )
    return {
        "writes_per_episode_median": statistics.median(r["writes_per_episode"] for r in per_round),
        "idle_writes_per_second": round(idle_rate, 2),
        "batch_acquire_p50_s": round(statistics.median(acquire_seconds), 4),
        "batch_release_p50_s": round(statistics.median(release_seconds), 4),
        "rounds": per_round,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="episodes per step (one batch acquire)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    node = RealNode()
    log("starting (or reusing) the real-node cluster")
    node.up()
    namespace = ""
    try:
        log("building and importing the product and sandbox images")
        node.import_image([str(REPO / "hack" / "product-image"), "build", "--json"])
        node.import_image([str(REPO / "sandbox_image" / "build"), "--json"], SANDBOX_REF)
        namespace = f"bench-recycle-{int(time.time())}"
        node.kubectl("create", "namespace", namespace)
        node.kubectl("label", "namespace", namespace, *PSA_LABELS)
        values_file = Path(f"/tmp/{namespace}-values.yaml")
        values_file.write_text(yaml.safe_dump(values(args.batch)))
        log("helm install")
        node.helm(
            namespace,
            "install",
            "sandfleet",
            str(REPO / "helm" / "sandfleet"),
            "-f",
            str(values_file),
            "--wait",
            "--timeout",
            "300s",
        )
        token = node.kubectl(
            "-n", namespace, "create", "token", "sandfleet-test", "--audience", "sandfleet"
        ).strip()
        service = json.loads(
            node.kubectl("-n", namespace, "get", "service", "sandfleet-gateway", "-o", "json")
        )
        url = f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"
        result: dict[str, dict[str, Any]] = {}
        with Fleet(url=url, token=token, timeout=120) as fleet:
            for pool in POOLS:
                scale(node, namespace, pool, args.batch)
                result[pool] = measure_pool(node, fleet, namespace, pool, args.batch, args.rounds)
                result[pool]["resets"] = reset_outcomes(node, namespace, pool)
                log(f"{pool}: resets by outcome {result[pool]['resets']}")
                scale(node, namespace, pool, 0)
                wait_empty(node, namespace, pool)
    finally:
        if namespace:
            subprocess.run(
                [
                    str(node.bin_dir / "kubectl"),
                    f"--kubeconfig={node.kubeconfig}",
                    "delete",
                    "namespace",
                    namespace,
                    "--wait=false",
                ],
                capture_output=True,
                check=False,
            )
        if node.started and not args.keep:
            node.hack("down")
    fresh, recycled = (result[p]["writes_per_episode_median"] for p in POOLS)
    summary = {
        "name": "recycle_writes",
        "episodes_per_round": args.batch,
        "rounds": args.rounds,
        "fresh_writes_per_episode": fresh,
        "recycled_writes_per_episode": recycled,
        "ratio": round(recycled / fresh, 3) if fresh else None,
        "load_average": os.getloadavg()[0],
        "pools": result,
    }
    log(f"writes per episode, median of {args.rounds} rounds: without recycling {fresh}, recycled {recycled}")
    fresh_release, recycled_release = (result[p]["batch_release_p50_s"] for p in POOLS)
    log(
        "a step's release p50 (a recycled one waits for its resets): "
        f"{fresh_release} s without, {recycled_release} s recycled"
    )
    line = json.dumps(summary)
    if args.json:
        args.json.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
