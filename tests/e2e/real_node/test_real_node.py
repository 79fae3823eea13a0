"""The real node: gVisor and runc Pods, ClusterIP Services and NetworkPolicy enforcement, for real."""

from __future__ import annotations

import os
from typing import Any

import httpx

from localcluster import images
from tests.e2e.real_node.cluster import AGENT_HEADERS, RealCluster, http_get_from_pod, pod_json
from tests.support.kube import Kubectl, wait_until

READY_TIMEOUT = "120s"


def _run_pods(kube: Kubectl, *pods: dict[str, Any]) -> None:
    kube.apply(list(pods))
    names = [f"pod/{pod['metadata']['name']}" for pod in pods]
    kube("wait", "--for=condition=Ready", *names, f"--timeout={READY_TIMEOUT}", timeout=150)


def test_node_is_labelled_for_placement(real_cluster: RealCluster) -> None:
    node = real_cluster.kubectl.json("get", "node", real_cluster.node_name)
    labels = node["metadata"]["labels"]
    assert labels["topology.kubernetes.io/region"] == "us-east1"
    assert labels["topology.kubernetes.io/zone"] == "us-east1-b"
    assert labels["sandfleet.dev/real-node"] == "true"
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {})
    runtime_class = real_cluster.kubectl.json("get", "runtimeclass", real_cluster.runtime_class)
    assert runtime_class["handler"] == "runsc"


def test_gvisor_pod_runs_the_sandbox_under_gvisor(real_cluster: RealCluster) -> None:
    with real_cluster.namespace() as kube:
        _run_pods(kube, real_cluster.pod("sandbox", gvisor=True))
        dmesg = kube("exec", "sandbox", "--", "dmesg")
        assert "gVisor" in dmesg, dmesg
        kernel = kube("exec", "sandbox", "--", "uname", "-r").strip()
        assert kernel != os.uname().release, "the pod sees the host kernel: it is not sandboxed"
        # The agent's API from the host, straight to the pod's IP on the node's bridge.
        pod_ip = pod_json(kube, "sandbox")["status"]["podIP"]
        with httpx.Client(
            base_url=f"http://{pod_ip}:8000", timeout=30, trust_env=False, headers=AGENT_HEADERS
        ) as agent:
            assert (
                agent.post("/v1/exec", json={"argv": ["true"]}, headers={"Authorization": ""}).status_code
                == 401
            )
            result = agent.post("/v1/exec", json={"argv": ["cat", "/proc/version"]}).json()
        assert result["exit_code"] == 0
        assert "gVisor" in result["stdout"] or kernel in result["stdout"], result


def test_runc_pod_runs_on_the_host_kernel(real_cluster: RealCluster) -> None:
    with real_cluster.namespace() as kube:
        _run_pods(kube, real_cluster.pod("plain", gvisor=False))
        assert kube("exec", "plain", "--", "uname", "-r").strip() == os.uname().release


def test_cluster_ip_services_reach_pods_and_the_apiserver(real_cluster: RealCluster) -> None:
    with real_cluster.namespace() as kube:
        _run_pods(
            kube,
            real_cluster.pod("server", gvisor=False, labels={"app": "server"}),
            real_cluster.pod("client", gvisor=True, labels={"app": "client"}),
        )
        kube.apply(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "server"},
                "spec": {"selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": 8000}]},
            }
        )
        ip = kube("get", "service", "server", "-o", "jsonpath={.spec.clusterIP}").strip()
        # kube-proxy programs a new Service within a sync; until then the address leads nowhere.
        wait_until(
            lambda: http_get_from_pod(kube, "client", f"http://{ip}/v1/ready").startswith("200"),
            timeout=30,
            what=f"the Service {ip} to answer from a gVisor pod",
        )
        # The `kubernetes` Service: DNAT to the apiserver on the node IP (anonymous /version is allowed).
        answer = http_get_from_pod(kube, "client", "https://10.96.0.1:443/version")
        assert answer.startswith("200"), answer
        assert '"minor": "34"' in answer, answer


def test_network_policy_is_enforced(real_cluster: RealCluster) -> None:
    with real_cluster.namespace() as kube:
        _run_pods(
            kube,
            real_cluster.pod("server", gvisor=True, labels={"app": "server"}),
            real_cluster.pod("friend", gvisor=True, labels={"app": "friend"}),
            real_cluster.pod("stranger", gvisor=False, labels={"app": "stranger"}),
        )
        server_ip = pod_json(kube, "server")["status"]["podIP"]
        url = f"http://{server_ip}:8000/v1/ready"

        def reaches(client: str) -> bool:
            return http_get_from_pod(kube, client, url, timeout_s=2).startswith("200")

        assert reaches("friend")
        assert reaches("stranger")

        kube.apply(
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": "deny-ingress"},
                "spec": {"podSelector": {"matchLabels": {"app": "server"}}, "policyTypes": ["Ingress"]},
            }
        )
        wait_until(lambda: not reaches("friend"), timeout=30, what="the deny policy to block the friend")
        assert not reaches("stranger")
        # Probes from the node itself still pass (kube-router lets the node reach its pods).
        assert pod_json(kube, "server")["status"]["conditions"]

        kube.apply(
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": "allow-friend"},
                "spec": {
                    "podSelector": {"matchLabels": {"app": "server"}},
                    "policyTypes": ["Ingress"],
                    "ingress": [
                        {
                            "from": [{"podSelector": {"matchLabels": {"app": "friend"}}}],
                            "ports": [{"port": 8000}],
                        }
                    ],
                },
            }
        )
        wait_until(lambda: reaches("friend"), timeout=30, what="the allow rule to let the friend through")
        assert not reaches("stranger")


def test_import_image_names_an_archive_for_pods(real_cluster: RealCluster) -> None:
    """`hack/cluster import-image` under another name; a Pod of that name starts without any pull."""
    archive, _ = images.pause_image()  # the smallest real image at hand
    name = real_cluster.import_image(archive, "example.test/imported:1")
    assert name == "example.test/imported:1"
    with real_cluster.namespace() as kube:
        pod = real_cluster.pod("imported", gvisor=True, image="example.test/imported:1")
        del pod["spec"]["containers"][0]["readinessProbe"]  # catatonit -P serves nothing
        kube.apply(pod)
        kube("wait", "--for=jsonpath={.status.phase}=Running", "pod/imported", "--timeout=60s", timeout=90)


def test_a_sandbox_that_writes_past_its_ephemeral_storage_limit_is_evicted(real_cluster: RealCluster) -> None:
    """What a sandbox writes lands on the node's disk: the limit the operator sets (core/pods.py)
    holds under gVisor too: the kubelet counts the sandbox's writable layer and evicts it."""
    with real_cluster.namespace() as kube:
        pod = real_cluster.pod("fill", gvisor=True)
        pod["spec"]["containers"][0]["resources"] = {
            "requests": {"ephemeral-storage": "32Mi"},
            "limits": {"ephemeral-storage": "64Mi"},
        }
        _run_pods(kube, pod)
        kube("exec", "fill", "--", "dd", "if=/dev/urandom", "of=/root/fill", "bs=1M", "count=200", timeout=60)

        def evicted() -> bool:
            events = kube.json("get", "events", "--field-selector", "involvedObject.name=fill")["items"]
            return any(e["reason"] == "Evicted" and "ephemeral local storage" in e["message"] for e in events)

        wait_until(evicted, timeout=90, what="the kubelet to evict a sandbox 136 MiB past its disk limit")
        wait_until(
            lambda: pod_json(kube, "fill")["status"]["phase"] in ("Succeeded", "Failed"),
            timeout=60,
            what="the evicted sandbox to stop",
        )
