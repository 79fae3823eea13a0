"""The chart's network and caller defaults are closed: the gateway and operator reach the apiserver
only (not 0.0.0.0/0), only chosen Pods reach the gateway, and only tokens minted for it are accepted."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from typing import Any

import pytest
import yaml

from tests.support.kube import Kubectl
from tests.unit.helm.chart import (
    CHART,
    EVERYTHING,
    helm_binary,
    matches,
    named,
    objects,
    pod_templates,
    render,
)

APISERVER = "--set=networkPolicy.apiServer.cidrs={10.0.0.1/32}"


def _rules(docs: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
    found = []
    for policy in objects(docs, "NetworkPolicy"):
        for direction in ("ingress", "egress"):
            for rule in policy["spec"].get(direction) or ():
                found.append((policy["metadata"]["name"], direction, rule))
    return found


@pytest.mark.parametrize(
    "args",
    [
        (),
        (APISERVER,),
        ("-f", str(EVERYTHING)),
        ("--set", "tests.enabled=false", "--set", "networkPolicy.gatewayFrom=null"),
    ],
    ids=["offline", "apiserver-set", "everything", "no-clients"],
)
def test_no_network_policy_rule_opens_to_everyone(args: tuple[str, ...]) -> None:
    # A rule without peers, or with 0.0.0.0/0, admits every address: none may, unless values say so.
    for name, direction, rule in _rules(render(*args)):
        peers = rule.get("from" if direction == "ingress" else "to")
        if name.endswith("operator") and direction == "ingress":
            continue  # metrics and kubelet probes: a port, not a peer (networkPolicy.metricsFrom)
        assert peers, f"{name}: an {direction} rule without peers admits everyone: {rule}"
        cidrs = [p["ipBlock"]["cidr"] for p in peers if "ipBlock" in p]
        assert not {"0.0.0.0/0", "::/0"} & set(cidrs), f"{name} {direction}: {rule}"


def test_gateway_and_operator_reach_only_the_apiserver_addresses_given() -> None:
    docs = render(APISERVER)
    for name in ("sandfleet-gateway", "sandfleet-operator"):
        egress = named(docs, "NetworkPolicy", name)["spec"]["egress"]
        blocks = [p["ipBlock"]["cidr"] for r in egress for p in r["to"] if "ipBlock" in p]
        assert blocks == ["10.0.0.1/32"], name
    # Offline (no cluster to look the apiserver up in) nothing is opened rather than everything.
    for name in ("sandfleet-gateway", "sandfleet-operator"):
        egress = named(render(), "NetworkPolicy", name)["spec"]["egress"]
        assert not [p for r in egress for p in r["to"] if "ipBlock" in p], name


def test_gateway_admits_only_labelled_clients_and_the_charts_own_pods() -> None:
    docs = render()
    (rule,) = named(docs, "NetworkPolicy", "sandfleet-gateway")["spec"]["ingress"]
    selectors = [p["podSelector"] for p in rule["from"]]
    assert not [p for p in rule["from"] if set(p) != {"podSelector"}], "peers outside the namespace"

    def admitted(labels: dict[str, str]) -> bool:
        return any(matches(s, labels) for s in selectors)

    assert admitted({"sandfleet.dev/client": "true", "app": "rollouts"})
    assert admitted(pod_templates(docs)["sandfleet-test-lease"]["metadata"]["labels"])
    assert not admitted({"app": "anything-else"})
    assert not admitted({})
    # No clients to admit: only the gateway's own replicas (a run's profile gathers their spans),
    # never an empty peer list (which would admit everyone).
    closed = render("--set", "tests.enabled=false", "--set", "networkPolicy.gatewayFrom=null")
    (only,) = named(closed, "NetworkPolicy", "sandfleet-gateway")["spec"]["ingress"]
    gateway = named(closed, "Deployment", "sandfleet-gateway")["spec"]["selector"]["matchLabels"]
    assert [peer["podSelector"]["matchLabels"] for peer in only["from"]] == [gateway]


def test_gateway_accepts_only_tokens_minted_for_it_by_default() -> None:
    docs = render("--set", "rl.enabled=true")
    args = named(docs, "Deployment", "sandfleet-gateway")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--token-audience")] == ["--token-audience=sandfleet"]
    pods = pod_templates(docs)
    for name in ("sandfleet-actor", "sandfleet-learner", "sandfleet-test-lease"):
        volumes = pods[name]["spec"]["volumes"]
        (token,) = [v for v in volumes if v["name"] == "gateway-token"]
        assert token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == "sandfleet", name


def _slice_cidrs(kubectl: Kubectl) -> list[str]:
    """The `kubernetes` Service's EndpointSlice addresses as /32s; [] where the apiserver publishes none."""
    result = kubectl.run("get", "endpointslice", "kubernetes", "-n", "default", "-o", "json")
    if result.returncode != 0:
        return []
    endpoints = json.loads(result.stdout).get("endpoints") or []
    return sorted(f"{address}/32" for e in endpoints for address in e["addresses"])


def _apiserver_blocks(docs: list[dict[str, Any]], name: str) -> list[str]:
    egress = named(docs, "NetworkPolicy", name)["spec"]["egress"]
    return sorted(p["ipBlock"]["cidr"] for r in egress for p in r["to"] if "ipBlock" in p)


@pytest.mark.cluster
def test_apiserver_egress_defaults_to_the_kubernetes_services_endpoints(kubectl: Kubectl) -> None:
    """`helm install --dry-run=server` looks the apiserver up in the cluster, as install does.

    The local cluster's apiserver advertises 127.0.0.1 and so publishes no EndpointSlice: there the
    chart must open nothing (and NOTES must say so); the real node's cluster has one
    (tests/e2e/helm checks the install reaches it).
    """
    namespace = f"egress-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", namespace)
    try:
        result = subprocess.run(
            [str(helm_binary()), "install", "sandfleet", str(CHART), "-n", namespace, "--dry-run=server",
             "--set", "podSecurity.checkNamespace=false", "--set", f"runtimeClass.name=gvisor-{namespace}"],
            capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "KUBECONFIG": str(kubectl.kubeconfig)},
        )  # fmt: skip
    finally:
        kubectl("delete", "namespace", namespace, "--wait=false")
    assert result.returncode == 0, result.stderr
    manifest, _, notes = result.stdout.partition("NOTES:")
    docs = [d for d in yaml.safe_load_all(manifest.split("MANIFEST:", 1)[1]) if d]
    expected = _slice_cidrs(kubectl)
    for name in ("sandfleet-gateway", "sandfleet-operator"):
        assert _apiserver_blocks(docs, name) == expected, name
    if expected:
        assert f"reach only the apiserver at {', '.join(expected)}" in notes, notes
    else:
        assert "the apiserver's addresses were not found" in notes, notes
