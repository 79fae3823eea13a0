"""Runs have owners: another tenant cannot publish on, read, or feed a run; names and metrics are bounded.

Against a real `sandfleet serve --local` (real gVisor sandboxes), each tenant with its own token.
"""

from __future__ import annotations

import time

import pytest

from tests.support.tenants import TenantGateway, tenant_gateway

pytestmark = pytest.mark.gvisor
__all__ = ["tenant_gateway"]


def span(phase: str = "generate") -> dict[str, object]:
    now = time.time()
    return {"phase": phase, "start": now - 1, "end": now}


def test_another_tenant_cannot_publish_a_policy_on_a_run_it_does_not_own(
    tenant_gateway: TenantGateway,
) -> None:
    with tenant_gateway.client("alice") as alice, tenant_gateway.client("bob") as bob:
        assert alice.post("/v1/runs/alice-run/policy", json={"version": 3}).status_code == 200
        # Bob jumping the version would make every one of alice's acquires stale (409).
        hijack = bob.post("/v1/runs/alice-run/policy", json={"version": 1000, "staleness_bound": 0})
        assert hijack.status_code == 403, hijack.text
        assert hijack.json()["error"] == "run_forbidden"
        assert "belongs to another caller" in hijack.json()["detail"]
        assert alice.get("/v1/runs/alice-run/policy").json()["version"] == 3
        body = {"pool": "python", "labels": {"run": "alice-run"}, "policy_version": 3, "wait_seconds": 60}
        granted = alice.post("/v1/leases", json=body)
        assert granted.status_code == 201, granted.text
        alice.delete(f"/v1/leases/{granted.json()['leases'][0]['id']}")


def test_another_tenant_cannot_read_a_runs_profile_or_policy_or_inject_spans(
    tenant_gateway: TenantGateway,
) -> None:
    with tenant_gateway.client("alice") as alice, tenant_gateway.client("bob") as bob:
        assert alice.post("/v1/runs/alice-profiled/spans", json={"spans": [span()]}).status_code == 200
        assert alice.post("/v1/runs/alice-profiled/policy", json={"version": 1}).status_code == 200
        for response in (
            bob.get("/v1/runs/alice-profiled/profile"),
            bob.get("/v1/runs/alice-profiled/spans"),  # one replica's share, as the others ask for it
            bob.get("/v1/runs/alice-profiled/policy"),
            bob.post("/v1/runs/alice-profiled/spans", json={"spans": [span("train")] * 50}),
        ):
            assert response.status_code == 403, response.text
            assert response.json()["error"] == "run_forbidden"
        profile = alice.get("/v1/runs/alice-profiled/profile").json()
        assert profile["spans"] == 1
        assert len(alice.get("/v1/runs/alice-profiled/spans").json()["spans"]) == 1
    # An operator listed in SANDFLEET_GATEWAY_RUN_ADMINS sees every run.
    with tenant_gateway.client("ops") as ops:
        assert ops.get("/v1/runs/alice-profiled/profile").json()["spans"] == 1


def test_another_tenant_cannot_label_its_leases_with_a_run_it_does_not_own(
    tenant_gateway: TenantGateway,
) -> None:
    with tenant_gateway.client("alice") as alice, tenant_gateway.client("bob") as bob:
        assert alice.post("/v1/runs/alice-labelled/spans", json={"spans": [span()]}).status_code == 200
        body = {"pool": "python", "labels": {"run": "alice-labelled"}, "wait_seconds": 60}
        refused = bob.post("/v1/leases", json=body)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"] == "run_forbidden"


def test_run_names_are_validated_with_a_clear_422(tenant_gateway: TenantGateway) -> None:
    with tenant_gateway.client("alice") as alice:
        for bad in ("-leading-dash", "x" * 64, "sp ace", "semi;colon"):
            response = alice.post(f"/v1/runs/{bad}/spans", json={"spans": [span()]})
            assert response.status_code == 422, (bad, response.text)
            assert "run" in response.json()["detail"]
        labelled = alice.post(
            "/v1/leases", json={"pool": "python", "labels": {"run": "a b"}, "wait_seconds": 1}
        )
        assert labelled.status_code == 422, labelled.text
        assert labelled.json()["error"] == "invalid_run"


def test_metric_series_stay_bounded_whatever_run_names_clients_send(tenant_gateway: TenantGateway) -> None:
    with tenant_gateway.client("bob") as bob:
        before = len(bob.get("/metrics").text)
        for i in range(300):
            response = bob.post(f"/v1/runs/flood-{i}/spans", json={"spans": [span()]})
            assert response.status_code == 200, response.text
        text = bob.get("/metrics").text
    runs = {
        line.split('run="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("sandfleet_loop_phase_seconds_count{")
    }
    assert len(runs) <= 5 + 1, sorted(runs)  # SANDFLEET_GATEWAY_METRIC_RUNS=5, plus `other`
    assert "other" in runs
    print(f"/metrics: {before} -> {len(text)} bytes after 300 run names")
    assert len(text) < before + 40_000
