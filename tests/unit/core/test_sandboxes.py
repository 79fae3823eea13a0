"""The one reading of a sandbox Pod, lease ids and keys, and the order warm sandboxes are handed out in."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core import api
from sandfleet.core.leases import LeaseRecord, lease_expired
from sandfleet.core.model import (
    PREWARM_LABEL,
    SandboxPod,
    lease_cluster,
    lease_episode,
    lease_id,
    object_key,
    sandbox_key,
    split_lease_id,
)
from sandfleet.core.pods import sandbox_from_pod
from sandfleet.core.warm_index import pick_warm


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


def test_a_reserved_pod_reads_as_its_runs_with_its_episode_and_its_next_lease_id() -> None:
    reserved = pod()
    reserved["metadata"]["labels"][api.LEASE_STATE_LABEL] = api.LEASE_RESERVED
    reserved["metadata"]["annotations"] = {
        api.EPISODES_ANNOTATION: "2",
        api.RESERVED_ANNOTATION: json.dumps({"holder": "actor", "run": "r1", "since": 5.0}),
    }
    sandbox = sandbox_from_pod(reserved)
    assert sandbox is not None
    assert sandbox.reserved
    assert not sandbox.warm
    assert not sandbox.leased
    assert (sandbox.reserved_for, sandbox.reserved_since, sandbox.episodes) == (("actor", "r1"), 5.0, 2)
    assert sandbox.next_lease_id == "ns.python-abc~2"
    assert sandbox.key == "ns.python-abc"


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
    assert isinstance(base_sandbox, SandboxPod)


def test_a_pod_that_is_not_running_is_never_ready_whatever_its_last_condition() -> None:
    for phase in ("Succeeded", "Failed", "Unknown", "Pending"):
        stale = pod()
        stale["status"] = {**stale["status"], "phase": phase}
        sandbox = sandbox_from_pod(stale)
        assert sandbox is not None
        assert not sandbox.ready, phase
        assert not sandbox.warm, phase


def test_one_reading_serves_the_operator_and_the_gateway() -> None:
    full = pod()
    full["metadata"]["labels"].update(
        {
            api.MANAGED_BY_LABEL: api.MANAGED_BY,
            api.TEMPLATE_HASH_LABEL: "abc",
            api.IMAGE_KEY_LABEL: "img",
            PREWARM_LABEL: "true",
        }
    )
    full["spec"] = {**full["spec"], "nodeName": "n1", "nodeSelector": {api.ZONE_LABEL: "us-east1-b"}}
    full["status"]["conditions"].append({"type": "ContainersReady", "status": "True"})
    sandbox = sandbox_from_pod(full)
    assert sandbox is not None
    assert (sandbox.namespace, sandbox.pool, sandbox.key) == ("ns", "python", "ns.python-abc")
    assert (sandbox.template_hash, sandbox.image_key, sandbox.zone, sandbox.node) == (
        "abc",
        "img",
        "us-east1-b",
        "n1",
    )
    assert (sandbox.managed, sandbox.prewarm, sandbox.started, sandbox.free) == (True, True, True, True)
    assert sandbox.resource_version == "42"
    unmanaged = sandbox_from_pod(pod())
    assert unmanaged is not None
    assert not unmanaged.managed


def test_a_pod_without_a_lease_state_is_neither_free_nor_leased() -> None:
    unlabelled = pod()
    del unlabelled["metadata"]["labels"][api.LEASE_STATE_LABEL]
    sandbox = sandbox_from_pod(unlabelled)
    assert sandbox is not None
    assert (sandbox.free, sandbox.leased, sandbox.warm) == (False, False, False)


def test_the_lease_expiry_is_read_from_the_lease_record_old_pods_included() -> None:
    lease = LeaseRecord("ns.python-abc", "python", "actor", 100.0, 160.0, 60)
    leased = pod()
    leased["metadata"]["labels"][api.LEASE_STATE_LABEL] = api.LEASE_LEASED
    # A Pod leased by a version that also wrote the expiry on its own: the record still decides.
    leased["metadata"]["annotations"] = {
        api.LEASE_ANNOTATION: json.dumps(asdict(lease)),
        api.LEASE_EXPIRES_ANNOTATION: "160.000",
    }
    sandbox = sandbox_from_pod(leased)
    assert sandbox is not None
    assert sandbox.lease == lease
    assert sandbox.lease_expires_at == 160.0
    assert not lease_expired(sandbox.lease_expires_at, 159.9)
    assert lease_expired(sandbox.lease_expires_at, 160.0)
    assert not lease_expired(sandbox_from_pod(pod()).lease_expires_at, 1e12)  # type: ignore[union-attr]


@given(
    st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True),
    st.from_regex(r"[a-z0-9]([-.a-z0-9]{0,200}[a-z0-9])?", fullmatch=True),
    st.integers(min_value=0, max_value=10**6),
)
def test_lease_ids_split_back_into_what_made_them(namespace: str, name: str, episode: int) -> None:
    made = lease_id(namespace, name, episode)
    assert split_lease_id(made) == (namespace, name)
    assert lease_episode(made) == episode
    assert sandbox_key(made) == lease_id(namespace, name)


@given(
    st.from_regex(r"[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?", fullmatch=True),
    st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True),
    st.from_regex(r"[a-z0-9]([-.a-z0-9]{0,200}[a-z0-9])?", fullmatch=True),
    st.integers(min_value=0, max_value=10**6),
)
def test_a_fleet_members_lease_ids_say_which_member_holds_them(
    cluster: str, namespace: str, name: str, episode: int
) -> None:
    made = lease_id(namespace, name, episode, cluster)
    assert lease_cluster(made) == (cluster, lease_id(namespace, name, episode))
    assert split_lease_id(made) == (namespace, name)
    assert lease_episode(made) == episode
    assert sandbox_key(made) == lease_id(namespace, name, cluster=cluster)


def test_a_lease_id_without_a_member_is_the_one_clusters() -> None:
    assert lease_cluster("ns.sb-1~2") == ("", "ns.sb-1~2")
    assert lease_id("ns", "sb-1", 2, "eu1") == "eu1_ns.sb-1~2"
    assert replace(SandboxPod("ns", "sb-1", "python", "r"), cluster="eu1").key == "eu1_ns.sb-1"


def test_each_episode_of_a_recycled_sandbox_has_a_lease_id_of_its_own() -> None:
    assert lease_id("ns", "sb-1") == "ns.sb-1"  # a first episode keeps the id every older lease had
    assert lease_id("ns", "sb-1", 2) == "ns.sb-1~2"
    assert lease_episode("ns.sb-1~x") is None
    assert split_lease_id("ns.sb-1~x") is None
    assert lease_episode("ns.sb-1~") is None


def test_object_keys_and_lease_ids_are_distinct_formats() -> None:
    assert object_key("ns", "python") == "ns/python"
    assert lease_id("ns", "python-abc") == "ns.python-abc"


def test_a_pod_with_only_the_old_expiry_annotation_still_expires() -> None:
    old = pod()
    old["metadata"]["labels"][api.LEASE_STATE_LABEL] = api.LEASE_LEASED
    old["metadata"]["annotations"] = {api.LEASE_EXPIRES_ANNOTATION: "50.000"}
    sandbox = sandbox_from_pod(old)
    assert sandbox is not None
    assert sandbox.lease is None
    assert sandbox.lease_expires_at == 50.0
    assert lease_expired(sandbox.lease_expires_at, 50.0)
    old["metadata"]["annotations"] = {api.LEASE_EXPIRES_ANNOTATION: "soon"}
    assert sandbox_from_pod(old).lease_expires_at is None  # type: ignore[union-attr]
