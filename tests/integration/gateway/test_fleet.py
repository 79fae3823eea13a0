"""One gateway over two member clusters, each its own apiserver and etcd: leases go where the warm
sandboxes are, their ids name the member, and a member that stops answering costs only its own leases.

The member is partitioned, not shut down: its apiserver is frozen (SIGSTOP), so calls to it hang
as they would behind a dead network, and then thawed (SIGCONT) with its etcd intact. A real
Prometheus (Debian's) scrapes the fleet gateway throughout and sees the member go down and back.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandfleet.core import api
from tests.integration.gateway.conftest import TOKENS, Pool, loopback_sandbox, pool_manifest
from tests.support.agent_key import fleet_key_file
from tests.support.kube import Kubectl, wait_until
from tests.support.prometheus import Prometheus, running_prometheus
from tests.support.servers import free_port, wait_until_ready

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[3]
CRDS = REPO / "manifests" / "crds"
NAMESPACE = "fleet"
# Clear of every other cluster the tests and benchmarks start (tests/unit/hack/test_cluster.py checks)
# and below the ephemeral range; member i listens on each plus i x 100 (at most 3 members here).
PORTS = {
    "APISERVER": 21443,
    "ETCD": 21379,
    "ETCD_PEER": 21380,
    "CONTROLLER_MANAGER": 21257,
    "SCHEDULER": 21259,
    "KWOK": 21247,
}
# What a holder of a lease on a lost member is promised (docs/multi-cluster.md): an error within 15 s.
LOST_WITHIN_SECONDS = 15.0


@dataclass
class Member:
    name: str
    kubeconfig: Path
    pool: Pool
    state_dir: Path

    def apiserver_pid(self) -> int:
        return int((self.state_dir / "run" / "kube-apiserver.pid").read_text())


def hack_cluster(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / "hack" / "cluster"), *args], env=env, capture_output=True, text=True, timeout=900
    )


def has_default_serviceaccount(admin: Kubectl) -> Callable[[], bool]:
    return lambda: admin.run("-n", NAMESPACE, "get", "serviceaccount", "default").returncode == 0


@contextlib.contextmanager
def member_clusters(
    tmp_path: Path, count: int, pool: dict[str, Any], nodes: int = 6
) -> Iterator[list[Member]]:
    """`count` member clusters side by side (`hack/cluster up --clusters N`), each with `pool`."""
    state_dir = tmp_path / "cluster"
    env = dict(os.environ, SANDFLEET_CLUSTER_DIR=str(state_dir))
    env.update({f"SANDFLEET_{name}_PORT": str(port) for name, port in PORTS.items()})
    found: list[Member] = []
    try:
        up = hack_cluster(env, "up", "--clusters", str(count), "--nodes", str(nodes), "--gpu-nodes", "0")
        if up.returncode != 0:
            pytest.fail(f"{count} member clusters did not start:\n{up.stderr[-4000:]}")
        kubectl = Path(hack_cluster(env, "bin-dir").stdout.strip()) / "kubectl"
        for index in range(count):
            kubeconfig = Path(hack_cluster(env, "kubeconfig", "--member", str(index)).stdout.strip())
            admin = Kubectl(kubectl, kubeconfig)
            admin("apply", "--server-side", "--force-conflicts", "-f", str(CRDS))
            admin("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
            admin("create", "namespace", NAMESPACE)
            wait_until(
                has_default_serviceaccount(admin), timeout=30, what=f"member {index}'s default ServiceAccount"
            )
            kube = admin.in_namespace(NAMESPACE)
            kube.apply(pool)
            member_dir = state_dir if index == 0 else state_dir.with_name(f"cluster-m{index}")
            found.append(Member(f"m{index}", kubeconfig, Pool(kube, pool["metadata"]["name"]), member_dir))
        yield found
    finally:
        for member in found:  # a frozen apiserver would not stop on SIGTERM
            with contextlib.suppress(OSError, ValueError):
                os.kill(member.apiserver_pid(), signal.SIGCONT)
        hack_cluster(env, "down")


@pytest.fixture
def members(tmp_path: Path) -> Iterator[list[Member]]:
    """Two member clusters, each with the pool `python` (its sandboxes added by the test)."""
    with member_clusters(tmp_path, 2, pool_manifest("python")) as found:
        yield found


@contextlib.contextmanager
def running_fleet_gateway(members: list[Member], tmp_path: Path, *args: str) -> Iterator[str]:
    """A gateway over `members` (`--member m0=... --member m1=...`, then `args`); its URL."""
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKENS)
    port = free_port()
    log = tmp_path / "fleet-gateway.log"
    argv = [
        sys.executable, "-m", "sandfleet.cli", "gateway",
        "--host", "127.0.0.1", "--port", str(port), "--namespace", NAMESPACE,
        "--auth", "static", "--token-file", str(tokens),
        "--agent-key-file", str(fleet_key_file(tmp_path)),
        *(f"--member={m.name}={m.kubeconfig}" for m in members), *args,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}  # the members' own, only
    with log.open("wb") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, process, log, timeout=60, what="the fleet gateway to be ready")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        print(log.read_text()[-3000:])  # shown when the test fails


@pytest.fixture
def fleet_gateway(members: list[Member], tmp_path: Path, agent: int) -> Iterator[str]:
    """A gateway over both members; its URL."""
    # Member 1 holds the only us-east1 sandbox, whose address is a real agent on loopback.
    loopback_sandbox(members[1].pool, agent)
    with running_fleet_gateway(members, tmp_path) as url:
        yield url


def places(client: httpx.Client) -> dict[tuple[str, str], tuple[int, int]]:
    (pool,) = client.get("/v1/pools").raise_for_status().json()["pools"]
    return {(p["cluster"], p["region"]): (p["warm"], p["leased"]) for p in pool["places"]}


def shares(members: list[Member]) -> dict[str, str]:
    """Each member's share of the pool, as the fleet gateway wrote it there."""
    found = {}
    for member in members:
        pool = member.pool.kube.json("get", "sandboxpool", "python")
        found[member.name] = (pool["metadata"].get("annotations") or {}).get(api.FLEET_SHARE_ANNOTATION, "")
    return found


def member_up(prometheus: Prometheus) -> dict[str, float]:
    """sandfleet_gateway_member_up per cluster, as a real Prometheus scraped it from the gateway."""
    prometheus.wait_for_fresh_scrape()
    found = prometheus.query("sandfleet_gateway_member_up")
    return {sample["metric"]["cluster"]: float(sample["value"][1]) for sample in found}


def acquire(client: httpx.Client, count: int = 1, **body: Any) -> httpx.Response:
    return client.post("/v1/leases", json={"pool": "python", "count": count, "wait_seconds": 30, **body})


@dataclass
class Load:
    """Acquire-and-release cycles, renewals of a held lease, and the answers, while a member is lost."""

    client: httpx.Client
    held: str  # a lease on the surviving member, renewed throughout
    stop: threading.Event = field(default_factory=threading.Event)
    granted: list[tuple[str, str]] = field(default_factory=list)  # (lease id, sandbox)
    errors: list[str] = field(default_factory=list)
    slowest: float = 0.0

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            got = acquire(self.client, regions=["europe-west4"])  # member 1's region first
            self.slowest = max(self.slowest, time.monotonic() - started)
            if not got.is_success:
                self.errors.append(f"acquire: {got.status_code} {got.text}")
                continue
            (lease,) = got.json()["leases"]
            self.granted.append((lease["id"], lease["sandbox"]))
            released = self.client.delete(f"/v1/leases/{lease['id']}")
            if not released.is_success:
                self.errors.append(f"release: {released.status_code} {released.text}")
            renewed = self.client.post(f"/v1/leases/{self.held}/renew", json={})
            if not renewed.is_success:
                self.errors.append(f"renew: {renewed.status_code} {renewed.text}")
            time.sleep(0.15)  # a few cycles a second: the sandboxes are never made again here


def test_a_fleet_spills_over_and_survives_losing_a_member(
    members: list[Member], fleet_gateway: str, tmp_path: Path
) -> None:
    with running_prometheus(
        tmp_path / "prometheus", {"fleet-gateway": [fleet_gateway.removeprefix("http://")]}
    ) as prometheus:
        spill_over_and_lose_a_member(members, fleet_gateway, prometheus)


def spill_over_and_lose_a_member(members: list[Member], fleet_gateway: str, prometheus: Prometheus) -> None:
    m0, m1 = members
    m0.pool.add_sandboxes(80, region="asia-southeast1", prefix="a")
    m1.pool.add_sandboxes(6, region="europe-west4", prefix="b")
    client = httpx.Client(base_url=fleet_gateway, headers={"Authorization": "Bearer actor-token"}, timeout=60)
    wait_until(
        lambda: (
            places(client).get(("m0", "asia-southeast1"), (0, 0))[0] == 80
            and places(client).get(("m1", "europe-west4"), (0, 0))[0] == 6
        ),
        timeout=30,
        what="both members' warm sandboxes in /v1/pools",
    )
    assert places(client)[("m1", "us-east1")] == (1, 0)
    # Each member is told its share of the pool's warm target (its operator keeps that many).
    wait_until(lambda: shares(members) == {"m0": "0.5", "m1": "0.5"}, timeout=15, what="the members' shares")

    # Routing: the region hint finds member 1's sandbox; its id names member 1; exec reaches it there.
    near = acquire(client, regions=["us-east1"]).raise_for_status().json()["leases"][0]
    assert near["id"].startswith("m1_")
    assert (near["cluster"], near["sandbox"], near["region"]) == ("m1", "python-loop-0", "us-east1")
    ran = client.post(f"/v1/leases/{near['id']}/exec", json={"argv": ["echo", "hello from m1"]})
    assert ran.status_code == 200, ran.text
    assert ran.json()["stdout"] == "hello from m1\n"
    # A second tenant cannot reach it through the fleet: not read, run in, nor released.
    with httpx.Client(base_url=fleet_gateway, headers={"Authorization": "Bearer other-token"}) as other:
        for method, path, body in (
            ("GET", f"/v1/leases/{near['id']}", None),
            ("POST", f"/v1/leases/{near['id']}/exec", {"argv": ["true"]}),
            ("DELETE", f"/v1/leases/{near['id']}", None),
        ):
            refused = other.request(method, path, json=body)
            assert refused.status_code == 403, (method, path, refused.text)

    # Spillover: a group larger than member 1's warm europe-west4 takes the rest from member 0.
    group = acquire(client, 8, regions=["europe-west4"]).raise_for_status().json()["leases"]
    by_member = sorted(lease["cluster"] for lease in group)
    assert by_member == ["m0"] * 2 + ["m1"] * 6
    assert all(lease["id"].startswith(f"{lease['cluster']}_") for lease in group)
    on_m1 = [lease["id"] for lease in group if lease["cluster"] == "m1"]
    held = next(lease["id"] for lease in group if lease["cluster"] == "m0")
    # Warm sandboxes member 1 will hold when it is partitioned: acquires preferring its region go there.
    m1.pool.add_sandboxes(10, region="europe-west4", prefix="c")
    wait_until(
        lambda: places(client)[("m1", "europe-west4")] == (10, 6), timeout=30, what="member 1's warm ones"
    )

    # Loss under load: freeze member 1's apiserver; the load prefers member 1's region throughout.
    load = Load(httpx.Client(base_url=fleet_gateway, headers=dict(client.headers), timeout=60), held)
    worker = threading.Thread(target=load.run)
    os.kill(m1.apiserver_pid(), signal.SIGSTOP)
    frozen = time.monotonic()
    worker.start()
    lost_after: dict[str, float] = {}
    try:
        while len(lost_after) < 1 + len(on_m1) and time.monotonic() - frozen < 2 * LOST_WITHIN_SECONDS:
            for lease_id in [near["id"], *on_m1]:
                if lease_id not in lost_after:
                    answer = client.get(f"/v1/leases/{lease_id}", timeout=5)
                    if answer.status_code == 410:
                        assert "member cluster 'm1'" in answer.json()["detail"]
                        lost_after[lease_id] = time.monotonic() - frozen
            time.sleep(0.1)
        time.sleep(2)  # the load goes on against the survivor a while
        with httpx.Client(base_url=fleet_gateway, headers={"Authorization": "Bearer other-token"}) as other:
            stranger = other.get(f"/v1/leases/{near['id']}")
            assert stranger.status_code == 403, stranger.text  # not told that member 1 is down
        assert set(places(client)) == {("m0", "asia-southeast1")}  # member 1 withdrawn from the view
        assert member_up(prometheus) == {"m0": 1.0, "m1": 0.0}
        wait_until(lambda: shares([m0]) == {"m0": "1"}, timeout=10, what="member 1's share moved to member 0")
    finally:
        load.stop.set()
        worker.join(timeout=60)
    ended = sorted(round(t, 2) for t in lost_after.values())
    print(f"lost member's leases ended after {ended} s; {len(load.granted)} acquire-release cycles "
          f"meanwhile, slowest acquire {load.slowest:.2f} s")  # fmt: skip
    assert load.errors == []
    assert len(lost_after) == 1 + len(on_m1)
    assert max(lost_after.values()) <= LOST_WITHIN_SECONDS
    assert load.granted, "the survivor served nothing"
    assert all(lease_id.startswith("m0_") for lease_id, _ in load.granted)
    gone = client.delete(f"/v1/leases/{on_m1[0]}")
    assert gone.status_code in (200, 410), gone.text  # told, never a 500

    # Back: the member's sandboxes return, the leases lost with it stay ended, nothing leases twice.
    os.kill(m1.apiserver_pid(), signal.SIGCONT)
    wait_until(
        lambda: ("m1", "europe-west4") in places(client), timeout=30, what="member 1 back in /v1/pools"
    )
    assert member_up(prometheus) == {"m0": 1.0, "m1": 1.0}
    wait_until(lambda: shares(members) == {"m0": "0.5", "m1": "0.5"}, timeout=15, what="the shares back")
    wait_until(
        lambda: all(
            m1.pool.states()[n] == api.LEASE_RELEASED for n in ["python-loop-0", *m1_sandboxes(group)]
        ),
        timeout=30,
        what="the leases lost with member 1 released in its own ledger",
    )
    assert client.get(f"/v1/leases/{near['id']}").status_code in (404, 410)
    again = acquire(client, 1, regions=["europe-west4"]).raise_for_status().json()["leases"][0]
    assert again["cluster"] == "m1"
    every = [(lease["cluster"], lease["sandbox"]) for lease in [near, *group, again]]
    every += [("m0", sandbox) for _, sandbox in load.granted]
    assert len(every) == len(set(every)), "a sandbox was leased twice"
    # The truth in each member's own ledger: what the client holds is recorded there, by its id.
    assert m1.pool.leases_on_pods()[again["sandbox"]]["id"] == again["id"]
    held_sandbox = next(lease["sandbox"] for lease in group if lease["id"] == held)
    assert m0.pool.leases_on_pods()[held_sandbox]["id"] == held
    assert m0.pool.states()[held_sandbox] == api.LEASE_LEASED  # renewed all along, never lost


def m1_sandboxes(group: list[dict[str, Any]]) -> list[str]:
    return [lease["sandbox"] for lease in group if lease["cluster"] == "m1"]
