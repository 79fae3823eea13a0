"""The chart on the real apiserver: it installs only into a namespace labelled for Pod Security, and
the gateway's account can change nothing but the lease marks on sandfleet's sandbox Pods and its own
run ConfigMaps (RBAC alone lets it patch every Pod and ConfigMap of the namespace)."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sandfleet.core import api
from sandfleet.core.leases import LeaseRecord, lease_metadata, release_metadata, unclaim_metadata
from sandfleet.core.model import pool_from_object
from sandfleet.core.pods import sandbox_pod
from tests.support.kube import Kubectl, wait_until
from tests.unit.helm.chart import CHART, helm_binary

pytestmark = pytest.mark.cluster

PSA_LABELS = {
    "pod-security.kubernetes.io/enforce": "baseline",
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
}


def _helm(kubectl: Kubectl, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm_binary()), "--namespace", namespace, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "KUBECONFIG": str(kubectl.kubeconfig)},
        check=False,
    )


def _install_args(namespace: str) -> list[str]:
    # A fleet member too: the account a fleet gateway elsewhere uses here is held to the same rules.
    return [
        "install", "sandfleet", str(CHART), "--set", f"runtimeClass.name=gvisor-{namespace}",
        "--set", "fleetMember.enabled=true",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def installed(kubectl: Kubectl) -> Iterator[Kubectl]:
    """The chart in a fresh namespace labelled for Pod Security; uninstalled afterwards."""
    namespace = f"gw-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", namespace)
    try:
        kubectl("label", "namespace", namespace, *(f"{k}={v}" for k, v in PSA_LABELS.items()))
        result = _helm(kubectl, namespace, *_install_args(namespace), "--wait", "--timeout", "180s")
        assert result.returncode == 0, result.stderr
        yield kubectl.in_namespace(namespace)
        _helm(kubectl, namespace, "uninstall", "sandfleet", "--wait", "--timeout", "120s")
    finally:
        kubectl("delete", "namespace", namespace, "--wait=false")


def test_install_refuses_a_namespace_without_pod_security_labels(kubectl: Kubectl, namespace: str) -> None:
    result = _helm(kubectl, namespace, *_install_args(namespace), "--dry-run=server")
    assert result.returncode != 0
    assert f"kubectl label namespace {namespace} --overwrite" in result.stderr, result.stderr
    assert "pod-security.kubernetes.io/enforce=baseline" in result.stderr
    kubectl("label", "namespace", namespace, *(f"{k}={v}" for k, v in PSA_LABELS.items()))
    result = _helm(kubectl, namespace, *_install_args(namespace), "--dry-run=server")
    assert result.returncode == 0, result.stderr
    # Nor may helm make an unlabelled namespace itself.
    missing = f"{namespace}-new"
    result = _helm(kubectl, missing, *_install_args(missing), "--create-namespace", "--dry-run=server")
    assert result.returncode != 0
    assert f"namespace {missing} does not exist yet: create and label it first" in result.stderr, (
        result.stderr
    )


def _sandbox(namespace: str) -> dict[str, Any]:
    body = {
        "metadata": {"namespace": namespace, "name": "python", "uid": "u-1", "generation": 1},
        "spec": {
            "replicas": 1,
            "regions": [{"name": "us-east1"}],
            "template": {"image": "sandfleet/sandbox:0.1.0", "runtimeClassName": f"gvisor-{namespace}"},
        },
    }
    pool = pool_from_object(body)
    pod = sandbox_pod(pool, pool.template, name="python-0a1b2c3d", region="us-east1", zone=None)
    del pod["metadata"]["ownerReferences"]  # no pool object: the garbage collector would delete it
    return pod


def _as_gateway(
    kube: Kubectl, *args: str, stdin: str | None = None, account: str = "sandfleet-gateway"
) -> subprocess.CompletedProcess[str]:
    return kube.run(*args, f"--as=system:serviceaccount:{kube.namespace}:{account}", stdin=stdin)


def _patch(kube: Kubectl, kind: str, name: str, metadata: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    body = json.dumps({"metadata": metadata})
    return _as_gateway(kube, "patch", kind, name, "--type=merge", "-p", body)


def test_gateway_may_mark_leases_on_sandbox_pods(installed: Kubectl) -> None:
    installed.apply(_sandbox(str(installed.namespace)))
    # The gateway's own patches, every label and annotation it writes (a keyed lease, then the
    # claim taken back and a release).
    record = LeaseRecord("ns.python-0a1b2c3d", "python", "actor", 1.0, 61.0, 60, {"run": "r1"}, "key-1")
    lease = lease_metadata(record)
    # A fresh binding reaches the admission chain within a moment: retry the allowed write until then.
    wait_until(
        lambda: _patch(installed, "pod", "python-0a1b2c3d", lease).returncode == 0,
        timeout=30,
        what="the gateway's lease patch",
    )
    older = {
        "labels": {api.LEASE_STATE_LABEL: api.LEASE_LEASED},
        "annotations": {api.LEASE_EXPIRES_ANNOTATION: "1.0"},
    }
    for metadata in (unclaim_metadata(), older, lease_metadata(record), release_metadata()):
        written = _patch(installed, "pod", "python-0a1b2c3d", metadata)
        assert written.returncode == 0, (metadata, written.stderr)


@pytest.mark.parametrize(
    "metadata",
    [
        {"labels": {api.POOL_LABEL: "another-pool"}},
        {"labels": {api.MANAGED_BY_LABEL: None}},
        {"labels": {api.TEMPLATE_HASH_LABEL: "0000000000"}},
        {"labels": {"sandfleet.dev/extra": "x"}},
        {"annotations": {"something.else/entirely": "x"}},
        {"finalizers": ["example.com/keep"]},
    ],
    ids=["pool", "managed-by", "template-hash", "new-label", "other-annotation", "finalizer"],
)
def test_gateway_may_not_change_anything_else_on_a_sandbox_pod(
    installed: Kubectl, metadata: dict[str, Any]
) -> None:
    installed.apply(_sandbox(str(installed.namespace)))
    wait_until(
        lambda: (
            _patch(installed, "pod", "python-0a1b2c3d", {"labels": {api.RUN_LABEL: "r2"}}).returncode == 0
        ),
        timeout=30,
        what="the admission policy to be in force (an allowed write passes)",
    )
    result = _patch(installed, "pod", "python-0a1b2c3d", metadata)
    assert result.returncode != 0, f"the gateway's account changed {metadata}"
    assert "the gateway may change only a sandbox Pod's lease labels" in result.stderr, result.stderr


def test_gateway_may_not_touch_other_pods_or_configmaps(installed: Kubectl) -> None:
    other = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "someone-else", "labels": {"app": "other"}},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "example.test/app:1",
                    "securityContext": {"allowPrivilegeEscalation": False},
                }
            ]
        },
    }
    installed.apply(other)
    installed.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app-config"}, "data": {}})
    mine = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "sandfleet-run-0123456789abcdef"}}
    wait_until(
        lambda: _as_gateway(installed, "apply", "-f", "-", stdin=json.dumps(mine)).returncode == 0,
        timeout=30,
        what="the gateway to write its own run ConfigMap",
    )
    refused = _patch(installed, "pod", "someone-else", {"labels": {"app": "hijacked"}})
    assert refused.returncode != 0
    assert "sandfleet's sandbox Pods only" in refused.stderr, refused.stderr
    for name in ("app-config", "kube-root-ca.crt"):
        # The Role grants update (not patch) on ConfigMaps: a replace is what the gateway could send.
        changed = installed.json("get", "configmap", name)
        changed["metadata"].setdefault("labels", {})["x"] = "y"
        refused = _as_gateway(installed, "replace", "-f", "-", stdin=json.dumps(changed))
        assert refused.returncode != 0
        assert "only its run ConfigMaps" in refused.stderr, refused.stderr
    created = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "not-a-run"}}
    refused = _as_gateway(installed, "create", "-f", "-", stdin=json.dumps(created))
    assert refused.returncode != 0
    assert "only its run ConfigMaps" in refused.stderr, refused.stderr


def test_gateway_may_write_only_its_membership_leases(installed: Kubectl) -> None:
    """RBAC lets the gateway write Leases (its replicas' names are generated); the policy keeps it
    off every other, such as the operator's leader Lease."""
    spec = {"holderIdentity": "probe", "leaseDurationSeconds": 15}
    mine = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "sandfleet-gateway-probe", "labels": {api.GATEWAY_MEMBER_LABEL: "true"}},
        "spec": spec,
    }
    wait_until(
        lambda: _as_gateway(installed, "apply", "-f", "-", stdin=json.dumps(mine)).returncode == 0,
        timeout=30,
        what="the gateway to write its own membership Lease",
    )
    theirs = {**mine, "metadata": {"name": "sandfleet-operator"}, "spec": {"holderIdentity": "the-gateway"}}
    refused = _as_gateway(installed, "apply", "-f", "-", stdin=json.dumps(theirs))
    assert refused.returncode != 0
    assert "only its replicas' membership Leases" in refused.stderr, refused.stderr
    deleted = _as_gateway(installed, "delete", "lease", "sandfleet-gateway-probe")
    assert deleted.returncode == 0, deleted.stderr


def test_a_fleet_gateway_may_set_a_pools_share_and_nothing_else_of_it(installed: Kubectl) -> None:
    """The account a fleet gateway uses in this member may patch pools (their fleet-share
    annotation, its share of the warm target); the policy keeps it off their spec, labels and the
    rest, which would let it run any image or any number of sandboxes here."""
    pool = {
        "apiVersion": api.API_VERSION,
        "kind": api.POOL_KIND,
        "metadata": {"name": "shared"},
        "spec": {
            "replicas": 4,
            "regions": [{"name": "us-east1"}],
            "template": {
                "image": "sandfleet/sandbox:0.1.0",
                "runtimeClassName": f"gvisor-{installed.namespace}",
            },
        },
    }
    installed.apply(pool)

    def patch(body: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return _as_gateway(
            installed, "patch", "sandboxpool", "shared", "--type=merge", "-p", json.dumps(body),
            account="sandfleet-fleet-gateway",
        )  # fmt: skip

    share = {"metadata": {"annotations": {api.FLEET_SHARE_ANNOTATION: "0.5"}}}
    wait_until(lambda: patch(share).returncode == 0, timeout=30, what="the fleet gateway's share patch")
    assert (
        installed.json("get", "sandboxpool", "shared")["metadata"]["annotations"][api.FLEET_SHARE_ANNOTATION]
        == "0.5"
    )
    for body in (
        {"spec": {"replicas": 400}},
        {"spec": {"template": {"image": "example.test/miner:1"}}},
        {"metadata": {"labels": {"x": "y"}}},
        {"metadata": {"annotations": {"something.else/entirely": "x"}}},
        {"metadata": {"finalizers": ["example.com/keep"]}},
    ):
        refused = patch(body)
        assert refused.returncode != 0, f"the fleet gateway's account changed {body}"
        assert "only a pool's sandfleet.dev/fleet-share annotation" in refused.stderr, refused.stderr
    # The chart's own gateway holds no patch on pools at all.
    assert (
        _as_gateway(
            installed, "patch", "sandboxpool", "shared", "--type=merge", "-p", json.dumps(share)
        ).returncode
        != 0
    )
