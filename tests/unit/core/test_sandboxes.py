"""Reading sandboxes out of Pods, lease ids, and the order warm sandboxes are handed out in."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core import api
from sandfleet.core.sandboxes import Sandbox, pick_warm, sandbox_from_pod, split_lease_id


def pod(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "metadata": {
            "namespace": "ns",
            "name": "python-abc",
            "resourceVersion": "42",
            "creationTimestamp": "2026-11-29T12:00:00Z",
            "labels": {
                api.POOL_LABEL: "python",
                api.SANDBOX_REGION_LABEL: "us-east1",
                api.LEASE_STATE_LABEL: api.LEASE_FREE,
            },
        },
        "spec": {"containers": [{"name": "sandbox", "ports": [{"containerPort": 9000}]}]},
        "status": {
            "phase": "Running",
            "podIP": "10.1.2.3",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    base.update(overrides)
    return base


def test_a_ready_free_pod_is_a_warm_sandbox() -> None:
    sandbox = sandbox_from_pod(pod())
    assert sandbox is not None
    assert sandbox.warm
    assert sandbox.key == "ns.python-abc"
    assert sandbox.agent_url() == "http://10.1.2.3:9000"
    assert sandbox.created_at == 1795953600.0


def test_pods_that_are_not_warm() -> None:
    not_ready = pod(status={"phase": "Pending", "conditions": []})
    assert sandbox_from_pod(not_ready).warm is False  # type: ignore[union-attr]
    leased = pod()
    leased["metadata"]["labels"][api.LEASE_STATE_LABEL] = api.LEASE_LEASED
    assert sandbox_from_pod(leased).warm is False  # type: ignore[union-attr]
    deleting = pod()
    deleting["metadata"]["deletionTimestamp"] = "2026-11-29T12:01:00Z"
    assert sandbox_from_pod(deleting).warm is False  # type: ignore[union-attr]
    stranger = pod()
    del stranger["metadata"]["labels"][api.POOL_LABEL]
    assert sandbox_from_pod(stranger) is None


def test_lease_ids_split_into_namespace_and_pod() -> None:
    assert split_lease_id("ns.python-abc") == ("ns", "python-abc")
    assert split_lease_id("ns.pod.with.dots") == ("ns", "pod.with.dots")
    assert split_lease_id("nodot") is None
    assert split_lease_id(".x") is None
    assert split_lease_id("x.") is None


base_sandbox = sandbox_from_pod(pod())
regions = st.sampled_from(["us-east1", "europe-west4", "asia-southeast1"])


@given(
    st.lists(st.tuples(regions, st.booleans(), st.floats(0, 1000)), max_size=30),
    st.lists(regions, unique=True, max_size=3),
)
def test_pick_warm_prefers_regions_then_age_and_skips_the_rest(
    specs: list[tuple[str, bool, float]], preferred: list[str]
) -> None:
    assert base_sandbox is not None
    sandboxes = [
        replace(base_sandbox, name=f"s{i}", region=region, ready=ready, created_at=created)
        for i, (region, ready, created) in enumerate(specs)
    ]
    skip = frozenset(s.key for s in sandboxes[:2])
    picked = pick_warm(sandboxes, tuple(preferred), skip)
    assert all(s.warm and s.key not in skip for s in picked)
    assert len(picked) == sum(1 for s in sandboxes if s.warm and s.key not in skip)
    rank = {r: i for i, r in enumerate(preferred)}
    keys = [(rank.get(s.region, len(rank)), s.created_at) for s in picked]
    assert keys == sorted(keys)


def test_sandbox_is_hashable_plain_data() -> None:
    assert isinstance(base_sandbox, Sandbox)
