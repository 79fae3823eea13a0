"""A pool cannot run sandboxes without gVisor: only the RuntimeClasses the admin allows get Pods.

Two locks: the apiserver rejects such a pool (the chart's ValidatingAdmissionPolicy), and the operator
refuses one that got in anyway (no policy, or one created before it): a condition, an Event, no Pods.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sandfleet.core.model import Template
from sandfleet.core.pods import runtime_class_refusal
from tests.integration.controller.conftest import (
    OperatorProcess,
    condition,
    live_pods,
    pool_manifest,
    wait_ready,
)
from tests.support.kube import Kubectl, wait_until
from tests.unit.helm.chart import named, objects, render


def test_runtime_class_refusal_names_the_allowed_ones() -> None:
    assert runtime_class_refusal(Template(image="x", runtime_class_name="gvisor"), {"gvisor"}) is None
    refusal = runtime_class_refusal(Template(image="x", runtime_class_name="runc"), {"gvisor", "kata"})
    assert refusal is not None
    assert "'runc'" in refusal
    assert "gvisor, kata" in refusal
    assert runtime_class_refusal(Template(image="x"), set()) is not None


def test_chart_tells_the_operator_which_runtime_classes_pools_may_name() -> None:
    args = named(render(), "Deployment", "sandfleet-operator")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert [a for a in args if a.startswith("--runtime-class")] == ["--runtime-class=gvisor"]
    docs = render("--set", "runtimeClass.allowed={gvisor,kata-gvisor}")
    args = named(docs, "Deployment", "sandfleet-operator")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert [a for a in args if a.startswith("--runtime-class")] == [
        "--runtime-class=gvisor",
        "--runtime-class=kata-gvisor",
    ]


def _policy(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (policy,) = [
        d
        for d in objects(docs, "ValidatingAdmissionPolicy")
        if d["metadata"]["name"].endswith("runtime-class")
    ]
    return policy


def test_chart_admission_policy_lists_the_allowed_runtime_classes_for_its_namespace_only() -> None:
    docs = render(namespace="team-a")
    policy = _policy(docs)
    assert json.loads(policy["spec"]["variables"][0]["expression"]) == ["gvisor"]
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["sandboxpools"]
    (binding,) = [
        d
        for d in objects(docs, "ValidatingAdmissionPolicyBinding")
        if d["spec"]["policyName"] == policy["metadata"]["name"]
    ]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "team-a"}
    }
    assert not objects(render("--set", "admissionPolicy.enabled=false"), "ValidatingAdmissionPolicy")


# -- on the real apiserver ------------------------------------------------------------------


def _chart_policy_for(kubectl: Kubectl, namespace: str) -> list[dict[str, Any]]:
    """The chart's runtime-class policy and binding for `namespace`, applied for real."""
    docs = render(namespace=namespace)
    policy = _policy(docs)
    binding = next(
        d
        for d in objects(docs, "ValidatingAdmissionPolicyBinding")
        if d["spec"]["policyName"] == policy["metadata"]["name"]
    )
    kubectl.apply([policy, binding])
    return [policy, binding]


@pytest.mark.cluster
def test_apiserver_refuses_a_pool_naming_a_runtime_class_that_is_not_allowed(
    kubectl: Kubectl, kube: Kubectl, namespace: str
) -> None:
    applied = _chart_policy_for(kubectl, namespace)
    try:
        runc = pool_manifest("escape", 1, template={"runtimeClassName": "runc"})
        # A new binding takes a moment to reach the admission chain.
        refusals: list[str] = []

        def refused() -> bool:
            result = kube.run("create", "--dry-run=server", "-f", "-", stdin=json.dumps(runc))
            refusals.append(result.stderr)
            return result.returncode != 0

        wait_until(refused, timeout=30, what="the admission policy to refuse a runc pool")
        assert "runtimeClassName runc is not allowed" in refusals[-1], refusals[-1]
        assert "gvisor" in refusals[-1]
        # A pool on the allowed class, and one that leaves it to the CRD's default (gvisor), pass.
        kube.apply(pool_manifest("fine", 1, template={"runtimeClassName": "gvisor"}))
        kube.apply(pool_manifest("defaulted", 1))
        # An update that swaps the class is refused too.
        swap = kube.run(
            "patch", "sandboxpool", "fine", "--type=merge", "-p",
            json.dumps({"spec": {"template": {"runtimeClassName": "runc"}}}),
        )  # fmt: skip
        assert swap.returncode != 0
        assert "not allowed" in swap.stderr, swap.stderr
    finally:
        for doc in applied:
            kubectl.run("delete", doc["kind"].lower(), doc["metadata"]["name"], "--wait=false")


@pytest.fixture
def plain_runtime_class(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """A RuntimeClass that exists but is no gVisor (handler runc): what an escaping pool would name."""
    name = f"plain-{namespace}"
    kubectl.apply(
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": name},
            "handler": "runc",
        }
    )
    yield name
    kubectl.run("delete", "runtimeclass", name, "--wait=false")


@pytest.mark.cluster
def test_operator_refuses_a_pool_naming_a_runtime_class_that_is_not_allowed(
    kube: Kubectl, start_operator: Any, runtime_class: str, plain_runtime_class: str
) -> None:
    # No admission policy in this namespace: the operator is the last lock.
    operator: OperatorProcess = start_operator()
    kube.apply(pool_manifest("allowed", 2, regions=[{"name": "us-east1", "minWarm": 1}]))
    kube.apply(
        pool_manifest(
            "escape",
            2,
            regions=[{"name": "us-east1", "minWarm": 1}],
            template={"runtimeClassName": plain_runtime_class},
        )
    )
    wait_ready(kube, "allowed", operator)

    def refused() -> bool:
        degraded = condition(kube, "escape", "Degraded")
        return degraded.get("reason") == "RuntimeClassNotAllowed" and degraded.get("status") == "True"

    wait_until(refused, timeout=60, what=f"the escape pool to be refused; log:\n{operator.log()}")
    message = condition(kube, "escape", "Degraded")["message"]
    assert f"'{plain_runtime_class}'" in message, message
    assert runtime_class in message, message
    assert condition(kube, "escape", "Ready")["status"] == "False"
    events = kube.json("get", "events", "--field-selector", "involvedObject.name=escape")["items"]
    assert [e["reason"] for e in events if e["type"] == "Warning"] == ["RuntimeClassNotAllowed"]
    # Passes keep coming (the allowed pool fills meanwhile), and still not one Pod for the escape.
    time.sleep(5)
    assert live_pods(kube, "escape") == []
    assert len(live_pods(kube, "allowed")) == 2
    # The allowed pool's Pods are the hardened ones, each with its own agent token.
    tokens = set()
    for pod in live_pods(kube, "allowed"):
        (container,) = pod["spec"]["containers"]
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["resources"]["limits"]["ephemeral-storage"] == "2Gi"
        tokens |= {e["value"] for e in container["env"] if e["name"] == "SANDFLEET_AGENT_TOKEN"}
    assert len(tokens) == 2
    # Fixed: the class goes back to an allowed one, and the pool fills.
    kube("patch", "sandboxpool", "escape", "--type=merge", "-p",
         json.dumps({"spec": {"template": {"runtimeClassName": runtime_class}}}))  # fmt: skip
    wait_ready(kube, "escape", operator)
