"""A fleet of three member clusters, each with its own operator, under one gateway and one Prometheus.

What the fleet promises with real operators in every member (docs/multi-cluster.md): each pool's warm target
is split over the members by weight and held to what each member's nodes can take (a member short
of nodes gives its part to the others, and gets it back); a member lost in the middle of a lease
load costs only its own leases, each with a clear error, while the survivors serve without one
error and take over its target; and a real Prometheus (Debian's) scrapes the fleet gateway and the
three operators, so that every query of the Grafana dashboard returns data for the whole fleet and
for one cluster. Each member's own ledgers are the truth the end checks: nothing leased twice,
nothing left leased once everything is released.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx
import pytest

from localcluster.members import MEMBER_PORT_STEP
from sandfleet.core import api
from sandfleet.core.model import lease_episode
from tests.integration.controller.conftest import OperatorProcess, spawn_operator
from tests.integration.controller.conftest import pool_manifest as managed_pool
from tests.integration.controller.test_dashboard import DASHBOARD, ask_every_query, traffic
from tests.integration.faults.kubeapi import KubeApi
from tests.integration.faults.truth import PodRecorder
from tests.integration.gateway.conftest import Pool, loopback_sandbox
from tests.integration.gateway.conftest import pool_manifest as unmanaged_pool
from tests.integration.gateway.test_fleet import (
    LOST_WITHIN_SECONDS,
    NAMESPACE,
    PORTS,
    Member,
    member_clusters,
    running_fleet_gateway,
    shares,
)
from tests.support.agent_key import fleet_key_file
from tests.support.invariants import Call, ClientLease, double_leases, unrecorded_leases
from tests.support.kube import wait_until
from tests.support.prometheus import Prometheus, running_prometheus

pytestmark = pytest.mark.cluster

POOL, REGION, RUN = "python", "us-east1", "fleet-dashboard"
REPLICAS = 12
WEIGHTS = {"m0": 2, "m1": 1, "m2": 1}  # m0 is given twice the others' part
BOUND = 1  # policy versions an episode may lag (the dashboard's staleness panels)


def targets(members: list[Member]) -> dict[str, tuple[int, int]]:
    """Each member's (warm target, warm sandboxes) of the pool, as its operator reports them."""
    found = {}
    for member in members:
        status = member.pool.kube.json("get", "sandboxpool", POOL).get("status") or {}
        regions = status.get("regions") or []
        found[member.name] = (sum(r.get("target", 0) for r in regions), int(status.get("ready") or 0))
    return found


def settled(members: list[Member], wanted: dict[str, int]) -> bool:
    """Whether each member aims at, and holds, the warm target `wanted` gives it."""
    return targets(members) == {name: (count, count) for name, count in wanted.items()}


def nothing_leased(pool: Pool) -> bool:
    return api.LEASE_LEASED not in pool.states().values()


def set_replicas(members: list[Member], replicas: int) -> None:
    for member in members:
        patch = json.dumps({"spec": {"replicas": replicas}})
        member.pool.kube("patch", "sandboxpool", POOL, "--type=merge", "-p", patch)


def cordon(member: Member, undo: bool = False) -> None:
    """Every node of `member` closed to new Pods (or open again): its room is what it holds."""
    nodes = member.pool.kube("get", "nodes", "-o", "name").split()
    member.pool.kube("uncordon" if undo else "cordon", *nodes)


def call(kind: str, started: float, answer: httpx.Response) -> Call:
    """One call on a lease as its holder saw it (the invariants' witness)."""
    if answer.is_success:
        body = answer.json()
        return Call(kind, started, time.time(), True, released=body.get("released"))
    problem = answer.json() if answer.headers.get("content-type", "").endswith("json") else {}
    return Call(kind, started, time.time(), False, answer.status_code, problem.get("error", ""),
                problem.get("detail", answer.text))  # fmt: skip


def granted(response: httpx.Response) -> list[tuple[str, ClientLease]]:
    """(member, what its holder was granted) for each lease of an acquire's answer."""
    at = time.time()
    return [
        (lease["cluster"], ClientLease(lease["idempotency_key"], lease["sandbox"], at, lease["expires_at"],
                                       episode=lease_episode(lease["id"]) or 0))
        for lease in response.json()["leases"]
    ]  # fmt: skip


@dataclass
class Load:
    """Acquire-release cycles and renewals of a held lease; every answer filed by its member."""

    client: httpx.Client
    held: ClientLease  # a lease on a surviving member, renewed throughout
    held_id: str
    stop: threading.Event = field(default_factory=threading.Event)
    leases: list[tuple[str, ClientLease]] = field(default_factory=list)  # (member, the lease)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (member or "", what went wrong)

    def run(self) -> None:
        cycle = 0
        while not self.stop.is_set():
            cycle += 1
            body = {"pool": POOL, "wait_seconds": 30, "idempotency_key": f"load-{cycle}"}
            got = self.client.post("/v1/leases", json=body)
            if not got.is_success:
                self.failed.append(("", f"acquire: {got.status_code} {got.text}"))
                continue
            ((member, lease),) = granted(got)
            self.leases.append((member, lease))
            started = time.time()
            released = self.client.delete(f"/v1/leases/{got.json()['leases'][0]['id']}")
            lease.calls.append(call("release", started, released))
            if not released.is_success:
                self.failed.append((member, f"release: {released.status_code} {released.text}"))
            started = time.time()
            renewed = self.client.post(f"/v1/leases/{self.held_id}/renew", json={})
            self.held.calls.append(call("renew", started, renewed))
            if not renewed.is_success:
                self.failed.append(("m0", f"renew: {renewed.status_code} {renewed.text}"))
            time.sleep(0.1)

    def served(self, member: str) -> int:
        return sum(1 for name, _ in self.leases if name == member)


@dataclass
class Fleet:
    members: list[Member]
    operators: list[OperatorProcess]
    # Each member's own record of its Pods and ledgers (watches the test owns, never the gateway's).
    recorders: dict[str, PodRecorder]
    # What every holder was granted, and each call it made, by member: the invariants' other witness.
    leases: list[tuple[str, ClientLease]] = field(default_factory=list)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """Three member clusters with the pool `python` (12 warm), an operator each (SANDFLEET_CLUSTER=m<i>)."""
    pool = managed_pool(POOL, REPLICAS)
    pool["spec"]["lease"] = {"defaultTTLSeconds": 300, "maxTTLSeconds": 3600}
    runtime = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "handler": "runsc"}
    with member_clusters(tmp_path, 3, pool) as members:
        started: list[OperatorProcess] = []
        recorders: dict[str, PodRecorder] = {}
        try:
            for index, member in enumerate(members):
                server = f"https://127.0.0.1:{PORTS['APISERVER'] + index * MEMBER_PORT_STEP}"
                recorders[member.name] = PodRecorder(KubeApi(server, member.state_dir / "pki"), NAMESPACE)
                recorders[member.name].start()
                member.pool.kube.apply({**runtime, "metadata": {"name": "gvisor"}})
                log, key = tmp_path / f"operator-{member.name}.log", fleet_key_file(tmp_path)
                started.append(
                    spawn_operator(member.kubeconfig, NAMESPACE, log, key, SANDFLEET_CLUSTER=member.name)
                )
            yield Fleet(members, started, recorders)
        finally:
            for member in members:  # the lost member's operator waits on its apiserver: thaw it first
                with contextlib.suppress(OSError, ValueError):
                    os.kill(member.apiserver_pid(), signal.SIGCONT)
            for operator in started:
                operator.stop()
            for recorder in recorders.values():
                recorder.stop()
                recorder.kube.close()
            for operator in started:
                print(f"--- {operator.log_path.name}\n{operator.log()[-2000:]}")  # shown when the test fails


def test_a_fleet_of_three_shares_its_targets_survives_a_loss_and_shows_on_one_dashboard(
    fleet: Fleet, tmp_path: Path, agent: int
) -> None:
    members = fleet.members
    m0 = members[0]
    # Exec needs a data plane: the one sandbox of m0's pool `other` is a real agent on loopback.
    m0.pool.kube.apply(unmanaged_pool("other"))
    loopback_sandbox(Pool(m0.pool.kube, "other"), agent)
    weights = [f"--member-weight={name}={weight}" for name, weight in WEIGHTS.items()]
    with running_fleet_gateway(members, tmp_path, *weights) as url:
        scraped = {
            "fleet-gateway": [url.removeprefix("http://")],
            "operator": [f"127.0.0.1:{o.metrics_port}" for o in fleet.operators],
        }
        with (
            running_prometheus(tmp_path / "prometheus", scraped) as prometheus,
            httpx.Client(base_url=url, headers={"Authorization": "Bearer actor-token"}, timeout=60) as client,
        ):
            share_by_weight_and_room(members)
            held = dashboard_traffic(fleet, client, prometheus)
            lost = lose_a_member_under_load(fleet, client, held, prometheus)
            every_dashboard_query_returns_data(prometheus)
            bring_it_back(fleet, client, held, lost)
    invariants_hold_in_every_member(fleet)


def share_by_weight_and_room(members: list[Member]) -> None:
    m1 = members[1]
    # By weight: 2:1:1 of 12.
    wait_until(
        lambda: shares(members) == {"m0": "0.5", "m1": "0.25", "m2": "0.25"}, timeout=30, what="shares"
    )
    wait_until(lambda: settled(members, {"m0": 6, "m1": 3, "m2": 3}), timeout=90, what="6/3/3 warm")
    # Short of nodes: m1 can hold no more than its 3, so of 24 the rest goes 2:1 to m0 and m2.
    started = time.monotonic()
    cordon(m1)
    set_replicas(members, 24)
    wait_until(lambda: settled(members, {"m0": 14, "m1": 3, "m2": 7}), timeout=90, what="14/3/7 warm")
    moved = time.monotonic() - started
    # Its nodes back: its part comes back.
    cordon(m1, undo=True)
    wait_until(lambda: settled(members, {"m0": 12, "m1": 6, "m2": 6}), timeout=90, what="12/6/6 warm")
    print(f"a member short of nodes: its part moved in {moved:.1f} s and came back "
          f"{time.monotonic() - started - moved:.1f} s after its nodes")  # fmt: skip
    set_replicas(members, REPLICAS)
    wait_until(lambda: settled(members, {"m0": 6, "m1": 3, "m2": 3}), timeout=90, what="6/3/3 warm again")


@dataclass(frozen=True)
class Held:
    """The lease on m0 the test keeps throughout (exec in the waves, renewed under the load)."""

    id: str
    lease: ClientLease


def dashboard_traffic(fleet: Fleet, client: httpx.Client, prometheus: Prometheus) -> Held:
    """Two waves of the dashboard's traffic (leases, execs, spans, a stale acquire); a lease held on m0."""
    version = BOUND + 2  # so that an acquire at version 0 is beyond the bound from the first wave
    policy = {"version": version, "staleness_bound": BOUND, "mode": "refuse"}
    assert client.post(f"/v1/runs/{RUN}/policy", json=policy).status_code == 200
    acquired = client.post(
        "/v1/leases", json={"pool": "other", "labels": {"run": RUN}, "idempotency_key": "held"}
    )
    assert acquired.status_code == 201, acquired.text
    ((member, lease),) = granted(acquired)
    assert member == "m0"
    fleet.leases.append((member, lease))
    held = Held(acquired.json()["leases"][0]["id"], lease)
    for _ in range(2):
        prometheus.wait_for_fresh_scrape()  # each wave a scrape apart: rate() sees every counter grow
        traffic(client, held.id, version, pool=POOL, region=REGION, run=RUN)
        version += 1
    return held


def lose_a_member_under_load(
    fleet: Fleet, client: httpx.Client, held: Held, prometheus: Prometheus
) -> list[str]:
    """m2 frozen in the middle of a lease load; the ids of the leases the test held on it."""
    members = fleet.members
    m0, m1, m2 = members
    # Leases the test holds on m2 when it goes: all 12 warm taken, the others given back at once.
    wait_until(lambda: settled(members, {"m0": 6, "m1": 3, "m2": 3}), timeout=90, what="6/3/3 warm")
    body = {"pool": POOL, "count": REPLICAS, "wait_seconds": 30, "idempotency_key": "group"}
    group = client.post("/v1/leases", json=body)
    assert group.status_code == 201, group.text
    leases = dict(zip((lease["id"] for lease in group.json()["leases"]), granted(group), strict=True))
    fleet.leases += leases.values()
    on_m2 = [lease_id for lease_id, (member, _) in leases.items() if member == "m2"]
    assert len(on_m2) == 3, [member for member, _ in leases.values()]
    for lease_id, (member, lease) in leases.items():
        if member != "m2":
            started = time.time()
            lease.calls.append(call("release", started, client.delete(f"/v1/leases/{lease_id}")))
            assert lease.calls[-1].ok, lease.calls[-1]
    load_client = httpx.Client(base_url=str(client.base_url), headers=dict(client.headers), timeout=60)
    load = Load(load_client, held.lease, held.id)
    worker = threading.Thread(target=load.run)
    worker.start()
    lost_after: dict[str, float] = {}
    try:
        time.sleep(3)  # the load runs over all three first
        os.kill(m2.apiserver_pid(), signal.SIGSTOP)
        frozen = time.monotonic()
        while len(lost_after) < len(on_m2) and time.monotonic() - frozen < 2 * LOST_WITHIN_SECONDS:
            for lease_id in on_m2:
                if lease_id not in lost_after:
                    started = time.time()
                    answer = client.get(f"/v1/leases/{lease_id}", timeout=5)
                    leases[lease_id][1].calls.append(call("read", started, answer))
                    if answer.status_code == 410:
                        assert "member cluster 'm2'" in answer.json()["detail"]
                        lost_after[lease_id] = time.monotonic() - frozen
            time.sleep(0.1)
        # The survivors take over m2's part: 2:1 of 12 between them.
        wait_until(lambda: shares([m0, m1]) == {"m0": "0.666666667", "m1": "0.333333334"}, timeout=15,
                   what="m2's share moved to m0 and m1")  # fmt: skip
        wait_until(lambda: {n: t for n, (t, _) in targets([m0, m1]).items()} == {"m0": 8, "m1": 4},
                   timeout=30, what="the survivors aiming at 8/4")  # fmt: skip
        time.sleep(2)  # the load goes on against the survivors a while
        prometheus.wait_for_fresh_scrape()
        up = {
            s["metric"]["cluster"]: float(s["value"][1])
            for s in prometheus.query("sandfleet_gateway_member_up")
        }
        assert up == {"m0": 1.0, "m1": 1.0, "m2": 0.0}
    finally:
        load.stop.set()
        worker.join(timeout=60)
        load_client.close()
        fleet.leases += load.leases
    wait_until(lambda: settled([m0, m1], {"m0": 8, "m1": 4}), timeout=60, what="8/4 warm on the survivors")
    recovered = time.monotonic() - frozen
    served = {name: load.served(name) for name in WEIGHTS}
    print(f"m2 lost under load: its {len(on_m2)} leases ended after "
          f"{sorted(round(t, 2) for t in lost_after.values())} s; the survivors warm again after "
          f"{recovered:.1f} s; cycles served by member {served}")  # fmt: skip
    assert len(lost_after) == len(on_m2)
    assert max(lost_after.values()) <= LOST_WITHIN_SECONDS
    assert [f for f in load.failed if f[0] != "m2"] == [], "an error on a surviving member (or an acquire)"
    for _, what in load.failed:  # a lease granted on m2 just before it went: told so, clearly
        assert what.startswith("release: 410"), what
        assert "member cluster 'm2'" in what, what
    assert served["m0"] > 0, "the load did not run over the survivors"
    assert served["m1"] > 0, "the load did not run over the survivors"
    return on_m2


def every_dashboard_query_returns_data(prometheus: Prometheus) -> None:
    """Every panel and variable of the dashboard, for the whole fleet and for cluster m0 alone."""
    board = json.loads(DASHBOARD.read_text())
    prometheus.wait_for_fresh_scrape()
    concrete = {"cluster": "m0", "pool": POOL, "region": REGION, "run": RUN}
    checked, empty = ask_every_query(prometheus, board, concrete)
    print(f"{len(checked)} dashboard queries asked of the fleet:\n" + "\n".join(checked))
    assert not empty, "dashboard queries that returned no data:\n" + "\n".join(empty)


def bring_it_back(fleet: Fleet, client: httpx.Client, held: Held, lost: list[str]) -> None:
    """m2 thawed: its part comes back, its lost leases stay ended and are released in its own ledger."""
    members = fleet.members
    m0, m2 = members[0], members[2]
    os.kill(m2.apiserver_pid(), signal.SIGCONT)
    wait_until(lambda: shares(members) == {"m0": "0.5", "m1": "0.25", "m2": "0.25"}, timeout=30,
               what="the shares back")  # fmt: skip
    wait_until(lambda: settled(members, {"m0": 6, "m1": 3, "m2": 3}), timeout=90, what="6/3/3 warm again")
    for lease_id in lost:
        assert client.get(f"/v1/leases/{lease_id}").status_code in (404, 410)
    started = time.time()
    held.lease.calls.append(call("release", started, client.delete(f"/v1/leases/{held.id}")))
    assert held.lease.calls[-1].ok, held.lease.calls[-1]
    for member in members:  # the truth in each member's own ledgers
        wait_until(
            partial(nothing_leased, member.pool), timeout=30, what=f"no lease left on {member.name}'s Pods"
        )
    assert nothing_leased(Pool(m0.pool.kube, "other"))


def invariants_hold_in_every_member(fleet: Fleet) -> None:
    """Each member's own record of its Pods against what the holders were told.

    Nothing leased twice; every lease granted there recorded there, under its holder's key.
    """
    for member in fleet.members:
        recorder = fleet.recorders[member.name]
        pods = recorder.snapshot()
        leases = [lease for name, lease in fleet.leases if name == member.name]
        assert leases, f"no lease on {member.name}"
        assert double_leases(pods, leases) == [], member.name
        assert unrecorded_leases(leases, pods, recorder.gaps_since(0.0)) == [], member.name
    print(
        f"invariants held on every member over {len(fleet.leases)} leases: "
        + ", ".join(f"{m.name} {sum(1 for n, _ in fleet.leases if n == m.name)}" for m in fleet.members)
    )
