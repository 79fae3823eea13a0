"""Policy versions on Kubernetes: one ConfigMap per run, so every gateway replica enforces the same bound.

Only lease control-plane calls here: kwok pod addresses are fake and never receive traffic.
"""

from __future__ import annotations

import json
import time

import pytest

from sandfleet.gateway.kube_policy import configmap_name
from tests.integration.gateway.conftest import GatewayFactory, Pool, wait_for
from tests.support.kube import Kubectl

pytestmark = pytest.mark.cluster


def test_a_version_published_through_one_gateway_is_enforced_by_another(
    pool: Pool, start_gateway: GatewayFactory, kube: Kubectl
) -> None:
    pool.add_sandboxes(2)
    learner_side, actor_side = start_gateway(), start_gateway()
    run = "Run_With.Capitals-1"  # free-form run names map to valid ConfigMap names
    with learner_side.client() as learner, actor_side.client() as actor:
        assert learner.post("/v1/runs/r/policy", json={"version": 0}).status_code == 200
        published = learner.post(f"/v1/runs/{run}/policy", json={"version": 9, "staleness_bound": 3})
        assert published.status_code == 200, published.text
        stored = kube.json("get", "configmap", configmap_name(run))
        assert json.loads(stored["data"]["policy.json"])["version"] == 9
        # The other replica reads the ConfigMap (its cache lives at most a second): it sees 9 soon.
        wait_for(
            lambda: actor.get(f"/v1/runs/{run}/policy").json().get("version") == 9,
            "the other replica to read version 9",
            timeout=30,
        )
        body = {"pool": "python", "labels": {"run": run}, "policy_version": 5, "wait_seconds": 1}
        refused = actor.post("/v1/leases", json=body)
        assert refused.status_code == 409
        assert refused.json()["error"] == "policy_stale"
        assert "4 versions behind" in refused.json()["detail"]
        granted = actor.post("/v1/leases", json={**body, "policy_version": 6})
        assert granted.status_code == 201, granted.text
        backwards = actor.post(f"/v1/runs/{run}/policy", json={"version": 8})
        assert backwards.status_code == 409
        assert learner.post(f"/v1/runs/{run}/policy", json={"version": 10}).status_code == 200


def test_a_run_belongs_to_its_creator_on_every_replica(start_gateway: GatewayFactory, kube: Kubectl) -> None:
    first, second = start_gateway(), start_gateway()
    with first.client() as owner, second.client(token="other-token") as other:
        assert owner.post("/v1/runs/owned/policy", json={"version": 2}).status_code == 200
        stored = json.loads(kube.json("get", "configmap", configmap_name("owned"))["data"]["policy.json"])
        assert stored["owner"] == "actor-0"
        # The other replica reads the owner from the ConfigMap, not from its own memory.
        hijack = other.post("/v1/runs/owned/policy", json={"version": 99})
        assert hijack.status_code == 403, hijack.text
        assert hijack.json()["error"] == "run_forbidden"
        assert other.get("/v1/runs/owned/profile").status_code == 403
        assert owner.post("/v1/runs/owned/policy", json={"version": 3}).status_code == 200
        # A run with no policy yet is claimed in the cluster too: the other replica knows its owner.
        now = time.time()
        spans = {"spans": [{"phase": "generate", "start": now - 1, "end": now}]}
        assert owner.post("/v1/runs/spans-only/spans", json=spans).status_code == 200
        squat = other.post("/v1/runs/spans-only/policy", json={"version": 1000, "staleness_bound": 0})
        assert squat.status_code == 403, squat.text
