"""The Grafana dashboard against a real Prometheus: every query it makes returns data from a live fleet.

Debian's prometheus scrapes the operator and the gateway (over the real apiserver, kwok nodes)
while a little real traffic runs in two waves, a scrape apart, so every counter and histogram
grows between scrapes and rate() has something to say. Each panel query is then asked with the
dashboard's default variables (All) and with one concrete cluster, pool, region and run: `.*`
alone would also match a label the metric does not have.

No panel needs a real node: spin-up is read from the Pods' own timestamps, which kwok writes as
a kubelet would (in whole seconds, so here every phase lands in the lowest bucket).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.controller.conftest import REPO, OperatorProcess, pool_manifest
from tests.integration.controller.test_with_gateway import ready_free
from tests.integration.gateway.conftest import GatewayFactory, Pool, agent, loopback_sandbox, start_gateway
from tests.integration.gateway.conftest import pool_manifest as unmanaged_pool
from tests.support.dashboard import every_expr, panel_queries, substitute, variable_queries
from tests.support.kube import Kubectl, wait_until
from tests.support.prometheus import Prometheus, running_prometheus

pytestmark = pytest.mark.cluster
__all__ = ["agent", "start_gateway"]  # the fixtures, imported for this module's tests

DASHBOARD = REPO / "helm" / "sandfleet" / "files" / "dashboard.json"
POOL, REGION, RUN = "python", "us-east1", "dashboard"
WARM = 4
BOUND = 1  # policy versions an episode may lag
# What Grafana would put in. $__rate_interval is at least four scrapes there; 2m spans the whole
# test here (about 20 s from the first wave to the queries), so every wave's increase is in it.
BUILTINS = {"__rate_interval": "2m", "__interval": "1s", "__range": "2m"}
# Each variable's allValue, the dashboard's default.
ALL = {"cluster": ".*", "pool": ".*", "region": ".*", "run": ".*"}
# The operator and the gateway here run with the default cluster name (the chart's clusterName).
CONCRETE = {"cluster": "default", "pool": POOL, "region": REGION, "run": RUN}


def traffic(
    client: httpx.Client,
    exec_lease: str,
    version: int,
    pool: str = POOL,
    region: str = REGION,
    run: str = RUN,
) -> None:
    """One wave: warm leases of the current policy, execs, loop spans, a refused stale acquire, releases."""
    acquire = {"pool": pool, "regions": [region], "labels": {"run": run}, "policy_version": version}
    leases = [client.post("/v1/leases", json=acquire) for _ in range(2)]
    assert [r.status_code for r in leases] == [201, 201], [r.text for r in leases]
    for command in ("true", "echo hi"):
        ran = client.post(f"/v1/leases/{exec_lease}/exec", json={"shell": command})
        assert ran.status_code == 200, ran.text
        assert ran.json()["exit_code"] == 0, ran.text
    now = time.time()
    spans = [
        {"phase": "generate", "start": now - 2, "end": now - 1},
        {"phase": "train", "start": now - 1, "end": now, "source": "learner"},
    ]
    reported = client.post(f"/v1/runs/{run}/spans", json={"spans": spans, "dropped_stale": 1})
    assert reported.status_code == 200, reported.text
    stale = client.post(
        "/v1/leases", json={**acquire, "policy_version": version - BOUND - 1, "wait_seconds": 0}
    )
    assert stale.status_code == 409, stale.text
    assert stale.json()["error"] == "policy_stale", stale.text
    # The learner moves on before the episodes end: each ends one version stale.
    published = client.post(f"/v1/runs/{run}/policy", json={"version": version + 1})
    assert published.status_code == 200, published.text
    for lease in leases:
        lease_id = lease.json()["leases"][0]["id"]
        released = client.delete(f"/v1/leases/{lease_id}")
        assert released.status_code == 200, released.text
        assert released.json()["released"] is True


def check_exposition(url: str) -> None:
    """`promtool check metrics` on what Prometheus scrapes from `url`."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: hack/bootstrap installs it (Debian package prometheus)"
    exposition = httpx.get(f"{url}/metrics", timeout=10).text
    checked = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True)
    assert checked.returncode == 0, f"{url}/metrics: {checked.stdout}{checked.stderr}"


def finite(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in samples if math.isfinite(float(s["value"][1]))]


def ask_every_query(
    prometheus: Prometheus, board: Mapping[str, Any], concrete: Mapping[str, str] = CONCRETE
) -> tuple[list[str], list[str]]:
    """(what was checked, what returned nothing): variables, then each panel query in both passes.

    `concrete`: the one value of each variable the second pass asks with (a fleet's test names a member).
    """
    queries = panel_queries(board)
    assert sorted(q.expr for q in queries) == sorted(every_expr(board)), "a query the panel walk missed"
    checked, empty = [], []
    for variable in variable_queries(board):
        assert variable.name in concrete, f"new variable ${variable.name}: give it a value in CONCRETE"
        match = substitute(variable.match, {**ALL, **BUILTINS})
        values = prometheus.label_values(variable.label, match)
        line = f"variable ${variable.name} = label_values({match}, {variable.label}): {values}"
        checked.append(line)
        if concrete[variable.name] not in values:
            empty.append(f"{line} (no {concrete[variable.name]!r})")
    for name, chosen in (("All", ALL), ("concrete", concrete)):
        for query in queries:
            expr = substitute(query.expr, {**chosen, **BUILTINS})
            samples = prometheus.query(expr)
            shown = ", ".join(f"{s['metric']}={s['value'][1]}" for s in samples[:4])
            line = f"[{name}] {query.where} ({query.ref}): {len(samples)} series {shown}"
            checked.append(line)
            if not finite(samples):
                empty.append(f"{line}\n    {expr}")
    return checked, empty


def test_every_dashboard_query_returns_data_from_a_real_prometheus(
    kube: Kubectl,
    start_operator: Callable[[], OperatorProcess],
    start_gateway: GatewayFactory,
    agent: int,
    tmp_path: Path,
) -> None:
    board = json.loads(DASHBOARD.read_text())
    managed = pool_manifest(POOL, WARM)
    managed["spec"]["lease"] = {"defaultTTLSeconds": 300, "maxTTLSeconds": 3600}
    kube.apply(managed)
    # Exec needs a data plane: the one sandbox of pool `other` is a real agent on loopback.
    kube.apply(unmanaged_pool("other"))
    loopback_sandbox(Pool(kube, "other"), agent)
    operator = start_operator()
    gateway = start_gateway()
    targets = {
        "gateway": [gateway.url.removeprefix("http://")],
        "operator": [f"127.0.0.1:{operator.metrics_port}"],
    }

    def pool_full() -> None:
        what = f"{WARM} warm sandboxes in {POOL}"
        wait_until(lambda: ready_free(kube) == WARM, timeout=90, what=what)

    started = time.monotonic()
    with running_prometheus(tmp_path / "prometheus", targets) as prometheus, gateway.client() as client:
        version = BOUND + 2  # so that an acquire at version 0 is beyond the bound from the first wave
        policy = {"version": version, "staleness_bound": BOUND, "mode": "refuse"}
        assert client.post(f"/v1/runs/{RUN}/policy", json=policy).status_code == 200
        held = client.post("/v1/leases", json={"pool": "other", "labels": {"run": RUN}})
        assert held.status_code == 201, held.text
        for _ in range(2):
            pool_full()  # each wave starts full: the operator refills behind the last wave's leases
            prometheus.wait_for_fresh_scrape()
            traffic(client, held.json()["leases"][0]["id"], version)
            version += 1
        pool_full()
        prometheus.wait_for_fresh_scrape()
        checked, empty = ask_every_query(prometheus, board)
        print(f"{len(checked)} dashboard queries asked {time.monotonic() - started:.1f} s after the start:")
        print("\n".join(checked))
        assert not empty, "dashboard queries that returned no data:\n" + "\n".join(empty)
    check_exposition(gateway.url)
    check_exposition(f"http://127.0.0.1:{operator.metrics_port}")
