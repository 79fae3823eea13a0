"""One gateway over three member clusters: the cost of a spilled lease, and what losing a member costs.

    .venv/bin/python bench/fleet.py [--warm-per-member 20] [--burst 10] [--rounds 3] [--load-seconds 30]

Starts three local clusters (`hack/cluster up --clusters 3`: each its own etcd, apiserver, scheduler
and kwok nodes) in a directory of its own, an operator in each, one pool whose regions differ per
member (member i holds region i), and a gateway with `--member` for each. Then:

- spillover: a burst of `--burst` acquires preferring member 0's region, first while member 0 has
  warm sandboxes (served there), then while all of member 0's are held and its nodes are full
  (cordoned: served by members 1 and 2): the medians side by side, over `--rounds` rounds;
- loss under load: client threads cycle acquire, release and renew across the fleet while member 2's
  apiserver is frozen (SIGSTOP: a partition, calls hang): errors on the survivors, how long until
  each lease held on member 2 answers 410, how long until the survivors' operators take on the lost
  member's share, and how long after the load until they hold the fleet's whole warm target; then
  thawed, until the shares are back.

Progress goes to stderr; the last stdout line is one JSON object of what was measured.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from kubebench import REPO, Cluster, Gateway, Operator, pool_manifest, wait
from localbench import log

NAME = "fleet"
NAMESPACE = "fleet"
REGIONS = ("us-east1", "europe-west4", "asia-southeast1")
# Its own directory and ports (member i: each plus 100 x i), clear of the tests' and other benchmarks'.
FLEET_ENV = {
    "SANDFLEET_CLUSTER_DIR": "/tmp/sandfleet-bench-fleet",
    "SANDFLEET_APISERVER_PORT": "28443",
    "SANDFLEET_ETCD_PORT": "28379",
    "SANDFLEET_ETCD_PEER_PORT": "28380",
    "SANDFLEET_CONTROLLER_MANAGER_PORT": "28257",
    "SANDFLEET_SCHEDULER_PORT": "28259",
    "SANDFLEET_KWOK_PORT": "28247",
}
TOKEN = "bench-token"
REGION_LABEL = "topology.kubernetes.io/region"


@dataclass
class Member:
    name: str
    region: str
    cluster: Cluster
    state_dir: Path
    operator: Operator | None = None

    def kubectl(self, *args: str) -> str:
        return self.cluster.kubectl("-n", NAMESPACE, *args)

    def pool(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.kubectl("get", "sandboxpool", "python", "-o", "json"))
        return found

    def share(self) -> str:
        return str((self.pool()["metadata"].get("annotations") or {}).get("sandfleet.dev/fleet-share", ""))

    def target_and_ready(self) -> tuple[int, int]:
        """Its region's warm target (its share of the fleet's) and how many warm ones are ready."""
        region = ((self.pool().get("status") or {}).get("regions") or [{}])[0]
        return int(region.get("target", 0)), int(region.get("ready", 0))

    def apiserver_pid(self) -> int:
        return int((self.state_dir / "run" / "kube-apiserver.pid").read_text())


def hack(*args: str) -> str:
    result = subprocess.run(
        [str(REPO / "hack" / "cluster"), *args],
        env={**os.environ, **FLEET_ENV},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if result.returncode != 0:
        raise SystemExit(f"hack/cluster {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return result.stdout.strip()


def start_members(count: int, warm_per_member: int, workdir: Path) -> list[Member]:
    log(NAME, f"starting {count} member clusters (hack/cluster up --clusters {count})")
    hack("up", "--clusters", str(count), "--nodes", "6", "--gpu-nodes", "0")
    kubectl_bin = Path(hack("bin-dir")) / "kubectl"
    base = Path(FLEET_ENV["SANDFLEET_CLUSTER_DIR"])
    members = []
    for index in range(count):
        cluster = Cluster(separate=True, separate_env=dict(FLEET_ENV))
        cluster.kubeconfig = Path(hack("kubeconfig", "--member", str(index)))
        cluster.kubectl_bin = kubectl_bin
        cluster.install()
        cluster.create_namespace(NAMESPACE)
        state_dir = base if index == 0 else base.with_name(f"{base.name}-m{index}")
        member = Member(f"m{index}", REGIONS[index], cluster, state_dir)
        # One pool, the fleet's whole warm target in every member: the gateway gives each its share.
        cluster.apply(pool_manifest("python", warm_per_member * count, [member.region]), NAMESPACE)
        member.operator = Operator(cluster, NAMESPACE, workdir / f"operator-{member.name}.log")
        member.operator.start()
        members.append(member)
    return members


def client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)


def acquire(http: httpx.Client, count: int = 1, **body: Any) -> httpx.Response:
    return http.post("/v1/leases", json={"pool": "python", "count": count, "wait_seconds": 60, **body})


def warm_by_member(http: httpx.Client) -> Counter[str]:
    (pool,) = http.get("/v1/pools").raise_for_status().json()["pools"]
    return Counter({p["cluster"]: p["warm"] for p in pool["places"]})


def burst(url: str, size: int, region: str) -> list[tuple[float, str]]:
    """`size` concurrent single acquires preferring `region`: (seconds, member) of each, released after."""

    def one(_: int) -> tuple[float, str, str]:
        with client(url) as http:
            started = time.perf_counter()
            lease = acquire(http, regions=[region]).raise_for_status().json()["leases"][0]
            return time.perf_counter() - started, lease["cluster"], lease["id"]

    with ThreadPoolExecutor(size) as pool:
        results = list(pool.map(one, range(size)))
    with client(url) as http:
        for _, _, lease_id in results:
            http.delete(f"/v1/leases/{lease_id}").raise_for_status()
    return [(seconds, member) for seconds, member, _ in results]


def spillover(url: str, members: list[Member], warm: int, size: int, rounds: int) -> dict[str, Any]:
    home = members[0]
    local: list[float] = []
    spilled: list[float] = []
    served: Counter[str] = Counter()
    with client(url) as http:
        for round_ in range(rounds):
            wait(lambda: warm_by_member(http)[home.name] >= warm, 300, f"{home.name} refilled", interval=0.5)
            local += [s for s, _ in burst(url, size, home.region)]
            wait(lambda: warm_by_member(http)[home.name] >= warm, 300, f"{home.name} refilled", interval=0.5)
            # Member 0 at capacity: its nodes full (cordoned), all of its warm sandboxes held.
            home.cluster.kubectl("cordon", "-l", f"{REGION_LABEL}={home.region}")
            held = acquire(http, warm, regions=[home.region]).raise_for_status().json()["leases"]
            assert {lease["cluster"] for lease in held} == {home.name}, "the group left its member"
            results = burst(url, size, home.region)
            spilled += [s for s, _ in results]
            served.update(member for _, member in results)
            for lease in held:
                http.delete(f"/v1/leases/{lease['id']}").raise_for_status()
            home.cluster.kubectl("uncordon", "-l", f"{REGION_LABEL}={home.region}")
            near, far = statistics.median(local) * 1000, statistics.median(spilled) * 1000
            log(
                NAME,
                f"spillover round {round_ + 1}/{rounds}: local p50 {near:.0f} ms, spilled p50 {far:.0f} ms",
            )
    return {
        "burst": size,
        "rounds": rounds,
        "local_p50_ms": round(statistics.median(local) * 1000, 1),
        "spilled_p50_ms": round(statistics.median(spilled) * 1000, 1),
        "spilled_to_local": round(statistics.median(spilled) / statistics.median(local), 2),
        "spilled_served_by": dict(served),
    }


@dataclass
class Load:
    url: str
    stop: threading.Event = field(default_factory=threading.Event)
    cycles: Counter[str] = field(default_factory=Counter)  # per member
    errors: list[tuple[str, str]] = field(default_factory=list)  # (member, or "" for an acquire; what)
    slowest: float = 0.0

    def run(self) -> None:
        with client(self.url) as http:
            while not self.stop.is_set():
                started = time.perf_counter()
                got = acquire(http)
                self.slowest = max(self.slowest, time.perf_counter() - started)
                if not got.is_success:
                    self.errors.append(("", f"acquire {got.status_code}: {got.text[:200]}"))
                    continue
                lease = got.json()["leases"][0]
                renewed = http.post(f"/v1/leases/{lease['id']}/renew", json={})
                released = http.delete(f"/v1/leases/{lease['id']}")
                for what, answer in (("renew", renewed), ("release", released)):
                    if not answer.is_success:
                        self.errors.append(
                            (lease["cluster"], f"{what} {answer.status_code}: {answer.text[:200]}")
                        )
                self.cycles[lease["cluster"]] += 1


def survivors_filled(survivors: list[Member], whole: int) -> bool:
    """Whether the survivors' targets add up to the fleet's whole target and each is ready at its own."""
    counts = [m.target_and_ready() for m in survivors]
    return sum(target for target, _ in counts) >= whole and all(ready >= target for target, ready in counts)


def loss(url: str, members: list[Member], warm: int, workers: int, seconds: float) -> dict[str, Any]:
    lost, survivors = members[-1], members[:-1]
    whole = warm * len(members)
    with client(url) as http:
        wait(lambda: warm_by_member(http)[lost.name] >= warm, 300, f"{lost.name} filled", interval=0.5)
        held = acquire(http, 5, regions=[lost.region]).raise_for_status().json()["leases"]
        assert {lease["cluster"] for lease in held} == {lost.name}
        loads = [Load(url) for _ in range(workers)]
        threads = [threading.Thread(target=load.run) for load in loads]
        for thread in threads:
            thread.start()
        time.sleep(seconds / 4)
        log(NAME, f"freezing {lost.name}'s apiserver (SIGSTOP) under {workers} cycling clients")
        os.kill(lost.apiserver_pid(), signal.SIGSTOP)
        frozen = time.monotonic()
        ended: dict[str, float] = {}
        moved: float | None = None
        try:
            # The load runs on the survivors for `seconds`, and until every lease lost with it ended.
            while time.monotonic() - frozen < seconds or len(ended) < len(held):
                for lease in held:
                    if lease["id"] not in ended and http.get(f"/v1/leases/{lease['id']}").status_code == 410:
                        ended[lease["id"]] = time.monotonic() - frozen
                if moved is None and sum(m.target_and_ready()[0] for m in survivors) >= whole:
                    moved = time.monotonic() - frozen  # the survivors' operators took the lost share on
                if time.monotonic() - frozen > 120:
                    break
                time.sleep(0.2)
        finally:
            for load in loads:
                load.stop.set()
            for thread in threads:
                thread.join(timeout=120)
        # Then, the load gone, the survivors fill the lost member's share: each ready at its new
        # target, as the pool's own Ready condition counts (warm ones; leased ones are extra).
        quiet = time.monotonic()
        try:
            filled: float | None = (
                wait(lambda: survivors_filled(survivors, whole), 300, "the survivors full") - quiet
            )
        except SystemExit:
            filled = None
        finally:
            os.kill(lost.apiserver_pid(), signal.SIGCONT)
        log(NAME, f"thawed {lost.name}; waiting for the shares to return")
        thawed = time.monotonic()
        equal = 1 / len(members)  # equal weights, every member with room: a third each again
        wait(lambda: all(abs(float(m.share() or 0) - equal) < 1e-6 for m in members), 120, "the shares back",
             interval=0.5)  # fmt: skip
        shares_back = time.monotonic() - thawed
    cycles: Counter[str] = Counter()
    for load in loads:
        cycles.update(load.cycles)
    errors = [e for load in loads for e in load.errors]
    # An acquire may be served by any member: its error counts against the survivors.
    on_survivors = [what for member, what in errors if member != lost.name]
    on_lost = [what for member, what in errors if member == lost.name]
    return {
        "workers": workers,
        "cycles_by_member": dict(cycles),
        "survivor_errors": len(on_survivors),
        "first_survivor_errors": on_survivors[:3],
        "lost_member_errors": len(on_lost),  # calls under leases lost with it: told 410, as they should be
        "slowest_acquire_s": round(max(load.slowest for load in loads), 2),
        "lost_leases": len(held),
        "lost_leases_410_after_s": sorted(round(t, 2) for t in ended.values()),
        "survivors_take_the_share_after_s": None if moved is None else round(moved, 1),
        "survivors_full_after_the_load_s": None if filled is None else round(filled, 1),
        "whole_target": whole,
        "shares_back_after_thaw_s": round(shares_back, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--warm-per-member", type=int, default=20)
    parser.add_argument("--burst", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--load-seconds", type=float, default=30)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="sandfleet-bench-fleet-"))
    members: list[Member] = []
    gateway: Gateway | None = None
    try:
        members = start_members(args.members, args.warm_per_member, workdir)
        members_flags = tuple((m.name, m.cluster.kubeconfig) for m in members)
        gateway = Gateway(members[0].cluster, NAMESPACE, workdir, token=TOKEN, members=members_flags)
        gateway.start()
        log(NAME, "waiting for each member to fill its share of the warm target")
        with client(gateway.url) as http:
            wait(
                lambda: all(warm_by_member(http)[m.name] >= args.warm_per_member for m in members),
                600,
                "every member's share warm",
                interval=1.0,
            )
        spill = spillover(gateway.url, members, args.warm_per_member, args.burst, args.rounds)
        lost = loss(gateway.url, members, args.warm_per_member, args.workers, args.load_seconds)
    finally:
        if gateway is not None:
            gateway.stop()
        for member in members:
            if member.operator is not None:
                member.operator.stop()
        hack("down")
    print(
        json.dumps(
            {
                "members": args.members,
                "warm_per_member": args.warm_per_member,
                "spillover": spill,
                "loss": lost,
            }
        )
    )


if __name__ == "__main__":
    main()
