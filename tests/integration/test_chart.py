"""The chart on the real apiserver: server-side dry runs, then install, RBAC, upgrade and uninstall.

kwok fakes the operator's and gateway's Pods as Running, so nothing here runs sandfleet itself:
these tests check the objects, that the apiserver accepts them, and what the accounts may do.
The whole path (pools filling, leases, `helm test`) runs on a real node in tests/e2e/.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sandfleet.core import api
from tests.support import leases as recorded_leases
from tests.support.kube import Kubectl, wait_until
from tests.support.servers import wait_until_ready
from tests.unit.helm.chart import CHART, EVERYTHING, helm_binary, render

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
SANDFLEET = REPO / ".venv" / "bin" / "sandfleet"

# What the install's components need (verb, resource, namespace or "" for cluster scope, name).
OPERATOR_MAY = [
    ("list", "pods", "*"),
    ("watch", "nodes", ""),
    ("create", "pods", "NS"),
    ("delete", "pods", "NS"),
    ("create", "events", "NS"),
    ("watch", "sandboxpools.sandfleet.dev", "NS"),
    ("list", "sandboxprewarms.sandfleet.dev", "NS"),
    ("patch", "sandboxpools.sandfleet.dev/status", "NS"),
    ("create", "leases.coordination.k8s.io", "NS"),
    ("update", "leases.coordination.k8s.io/sandfleet-operator", "NS"),
    ("watch", "sandboxledgers.sandfleet.dev", "NS"),
    ("patch", "sandboxledgers.sandfleet.dev", "NS"),
]
OPERATOR_MAY_NOT = [
    ("create", "pods", "default"),
    ("delete", "pods", "default"),
    ("patch", "pods", "NS"),
    ("get", "secrets", "NS"),
    ("update", "leases.coordination.k8s.io/kube-scheduler", "kube-system"),
    ("update", "leases.coordination.k8s.io/another-lease", "NS"),
    ("patch", "sandboxpools.sandfleet.dev", "NS"),
    ("create", "tokenreviews.authentication.k8s.io", ""),
]
GATEWAY_MAY = [
    ("watch", "pods", "NS"),
    ("patch", "pods", "NS"),
    ("list", "sandboxpools.sandfleet.dev", "NS"),
    ("patch", "sandboxprewarms.sandfleet.dev", "NS"),
    ("update", "configmaps", "NS"),
    ("create", "tokenreviews.authentication.k8s.io", ""),
    ("create", "subjectaccessreviews.authorization.k8s.io", ""),
    ("watch", "sandboxledgers.sandfleet.dev", "NS"),
    ("create", "sandboxledgers.sandfleet.dev", "NS"),
    ("patch", "sandboxledgers.sandfleet.dev", "NS"),
]
GATEWAY_MAY_NOT = [
    ("list", "pods", "default"),
    ("create", "pods", "NS"),
    ("delete", "pods", "NS"),
    ("get", "secrets", "NS"),
    ("patch", "sandboxpools.sandfleet.dev/status", "NS"),
    ("list", "nodes", ""),
    ("delete", "sandboxledgers.sandfleet.dev", "NS"),
    ("patch", "sandboxledgers.sandfleet.dev", "default"),
]


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    kubectl: Kubectl

    def helm(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubectl.kubeconfig)}
        return subprocess.run(
            [str(helm_binary()), "--namespace", self.namespace, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )

    def can(self, account: str, verb: str, resource: str, namespace: str) -> bool:
        """`kubectl auth can-i` as one of the release's ServiceAccounts ("NS": the release namespace)."""
        kind, _, tail = resource.partition("/")
        args = ["auth", "can-i", verb, kind if tail == "status" else resource]
        if tail == "status":
            args.append("--subresource=status")
        args.append(f"--as=system:serviceaccount:{self.namespace}:{account}")
        if namespace == "*":
            args.append("--all-namespaces")
        elif namespace:
            args.append(f"--namespace={namespace.replace('NS', self.namespace)}")
        result = self.kubectl.run(*args)
        answer = result.stdout.strip()
        assert answer in ("yes", "no"), result.stderr
        return answer == "yes"


def _install_args(namespace: str) -> list[str]:
    # A RuntimeClass of the release's own: cluster-scoped, so it must not collide with other tests'.
    return ["--set", f"runtimeClass.name=gvisor-{namespace}", "--wait", "--timeout", "180s"]


# What the chart's podSecurity values ask of its namespace (an install elsewhere fails).
PSA_LABELS = (
    "pod-security.kubernetes.io/enforce=baseline",
    "pod-security.kubernetes.io/warn=restricted",
    "pod-security.kubernetes.io/audit=restricted",
)


def _fresh_namespace(kubectl: Kubectl) -> str:
    name = f"chart-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    kubectl("label", "namespace", name, *PSA_LABELS)
    return name


@pytest.fixture(scope="module")
def release(kubectl: Kubectl) -> Iterator[Release]:
    """The chart installed (defaults) into a fresh namespace; uninstalled afterwards."""
    namespace = _fresh_namespace(kubectl)
    installed = Release("sandfleet", namespace, kubectl)
    result = installed.helm("install", "sandfleet", str(CHART), *_install_args(namespace))
    assert result.returncode == 0, result.stderr
    yield installed
    installed.helm("uninstall", "sandfleet", "--wait", "--timeout", "120s")
    kubectl("delete", "namespace", namespace, "--wait=false")


def _server_dry_run(kube: Kubectl, docs: list[dict[str, Any]]) -> str:
    document = {"apiVersion": "v1", "kind": "List", "items": docs}
    return kube("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(document))


@pytest.mark.parametrize("everything", [False, True], ids=["defaults", "everything"])
def test_the_apiserver_accepts_every_rendered_object(kube: Kubectl, namespace: str, everything: bool) -> None:
    args = ["-f", str(EVERYTHING)] if everything else []
    docs = render(*args, "--set", f"runtimeClass.name=gvisor-{namespace}", namespace=namespace)
    # The ServiceMonitor's CRD belongs to prometheus-operator, which this cluster does not run.
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    applied = [d for d in docs if d["kind"] != "ServiceMonitor"]
    assert len(monitors) == (1 if everything else 0)
    # A Pod's admission looks its ServiceAccount up, which a dry run never creates: make those for
    # real (the namespace is the test's own), then dry-run everything.
    accounts = [d for d in applied if d["kind"] == "ServiceAccount"]
    kube("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": accounts}))
    out = _server_dry_run(kube, applied)
    assert out.count("(server dry run)") == len(applied), out


def test_the_apiserver_rejects_a_pool_the_schema_lets_through_but_the_crd_does_not(
    kube: Kubectl, namespace: str, tmp_path: Path
) -> None:
    # CEL rules live only in the CRD: minWarm over replicas passes values.schema.json, not the apiserver.
    pools = yaml.safe_load((CHART / "values.yaml").read_text())["pools"]
    pools[0]["replicas"] = 1
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"pools": pools}))
    docs = render("-f", str(values), namespace=namespace)
    pools = [d for d in docs if d["kind"] == "SandboxPool"]
    result = kube.run(
        "apply",
        "--dry-run=server",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": pools}),
    )
    assert result.returncode != 0
    assert "minWarm add up to more than spec.replicas" in result.stderr


def test_install_creates_the_objects_and_their_pods_run(release: Release) -> None:
    kube = release.kubectl.in_namespace(release.namespace)
    deployments = {d["metadata"]["name"]: d for d in kube.json("get", "deployments")["items"]}
    assert set(deployments) == {"sandfleet-operator", "sandfleet-gateway"}
    for deployment in deployments.values():
        assert deployment["status"].get("readyReplicas") == deployment["spec"]["replicas"]
    pool = kube.json("get", "sandboxpool", "python")
    assert pool["spec"]["template"]["runtimeClassName"] == f"gvisor-{release.namespace}"
    runtime_class = release.kubectl.json("get", "runtimeclass", f"gvisor-{release.namespace}")
    assert runtime_class["handler"] == "runsc"
    status = release.helm("status", "sandfleet", "-o", "json")
    assert json.loads(status.stdout)["info"]["status"] == "deployed"


@pytest.mark.parametrize("case", OPERATOR_MAY, ids=str)
def test_operator_may(release: Release, case: tuple[str, str, str]) -> None:
    assert release.can("sandfleet-operator", *case), case


@pytest.mark.parametrize("case", OPERATOR_MAY_NOT, ids=str)
def test_operator_may_not(release: Release, case: tuple[str, str, str]) -> None:
    assert not release.can("sandfleet-operator", *case), case


@pytest.mark.parametrize("case", GATEWAY_MAY, ids=str)
def test_gateway_may(release: Release, case: tuple[str, str, str]) -> None:
    assert release.can("sandfleet-gateway", *case), case


@pytest.mark.parametrize("case", GATEWAY_MAY_NOT, ids=str)
def test_gateway_may_not(release: Release, case: tuple[str, str, str]) -> None:
    assert not release.can("sandfleet-gateway", *case), case


def test_the_test_account_may_use_the_chart_pools_only(release: Release) -> None:
    assert release.can("sandfleet-test", "use", "sandboxpools.sandfleet.dev/python", "NS")
    assert not release.can("sandfleet-test", "use", "sandboxpools.sandfleet.dev/other", "NS")
    assert not release.can("sandfleet-test", "get", "pods", "NS")
    assert not release.can("sandfleet-sandbox", "get", "pods", "NS")


def test_the_gateway_account_can_prefetch_by_server_side_apply(release: Release) -> None:
    # POST /v1/prefetch applies a SandboxPrewarm server-side; the Role must allow it for real.
    prewarm = {
        "apiVersion": "sandfleet.dev/v1alpha1",
        "kind": "SandboxPrewarm",
        "metadata": {"name": "python-abc", "namespace": release.namespace},
        "spec": {
            "pool": "python",
            "image": "localhost/sandfleet/sandbox:0.1.0",
            "count": 1,
            "ttlSeconds": 60,
        },
    }
    account = f"--as=system:serviceaccount:{release.namespace}:sandfleet-gateway"
    for _ in range(2):  # create, then update, as the gateway does on repeated prefetches
        apply = ["apply", "--server-side", "--field-manager=sandfleet-gateway", "--force-conflicts"]
        release.kubectl(*apply, account, "-f", "-", stdin=json.dumps(prewarm))


def test_upgrade_keeps_the_pools_and_rolls_the_gateway(release: Release) -> None:
    kube = release.kubectl.in_namespace(release.namespace)
    uid = kube.json("get", "sandboxpool", "python")["metadata"]["uid"]
    result = release.helm(
        "upgrade",
        "sandfleet",
        str(CHART),
        *_install_args(release.namespace),
        "--set",
        "gateway.maxWaiting=50",
    )
    assert result.returncode == 0, result.stderr
    # Same pool object (its sandboxes and their leases stay), new gateway flags.
    assert kube.json("get", "sandboxpool", "python")["metadata"]["uid"] == uid
    gateway = kube.json("get", "deployment", "sandfleet-gateway")
    assert "--max-waiting=50" in gateway["spec"]["template"]["spec"]["containers"][0]["args"]
    history = json.loads(release.helm("history", "sandfleet", "-o", "json").stdout)
    assert [h["revision"] for h in history] == [1, 2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _account_kubeconfig(release: Release, account: str, path: Path) -> Path:
    """A kubeconfig that is the release's ServiceAccount `account` (a fresh token), nothing more."""
    admin = yaml.safe_load(release.kubectl.kubeconfig.read_text())
    token = release.kubectl("-n", release.namespace, "create", "token", account, "--duration=1h").strip()
    cluster = admin["clusters"][0]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": account, "user": {"token": token}}],
                "contexts": [{"name": account, "context": {"cluster": cluster["name"], "user": account}}],
                "current-context": account,
            }
        )
    )
    return path


def _chart_command(release: Release, deployment: str, overrides: dict[str, str]) -> list[str]:
    """The installed Deployment's command line, run from this checkout, with some flags replaced."""
    kube = release.kubectl.in_namespace(release.namespace)
    container = kube.json("get", "deployment", deployment)["spec"]["template"]["spec"]["containers"][0]
    command = [str(SANDFLEET), *container["command"][1:]]
    for arg in container["args"]:
        flag = arg.split("=", 1)[0]
        command.append(f"{flag}={overrides[flag]}" if flag in overrides else arg)
    return command


def _agent_key_file(release: Release, path: Path) -> Path:
    """The release's fleet key (its Secret) in a file, as the chart mounts it into both components."""
    kube = release.kubectl.in_namespace(release.namespace)
    path.write_bytes(
        base64.b64decode(kube("get", "secret", "sandfleet-agent-key", "-o", "jsonpath={.data.key}"))
    )
    return path


def _start(
    command: list[str], kubeconfig: Path, log: Path, namespace: str, key: Path
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "POD_NAMESPACE": namespace,
        "SANDFLEET_OPERATOR_AGENT_KEY_FILE": str(key),
        "SANDFLEET_GATEWAY_AGENT_KEY_FILE": str(key),
    }
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _ready_free(kube: Kubectl, pool: str) -> int:
    return sum(sandbox.warm for sandbox in recorded_leases.read(kube, f"{api.POOL_LABEL}={pool}").values())


def test_the_chart_accounts_and_flags_run_the_real_operator_and_gateway(
    release: Release, tmp_path: Path
) -> None:
    """`sandfleet operator` and `sandfleet gateway` with the installed Deployments' flags, each as its
    own ServiceAccount: the pool fills, and a caller leases, publishes a policy and prefetches."""
    kube = release.kubectl.in_namespace(release.namespace)
    target = kube.json("get", "sandboxpool", "python")["spec"]["replicas"]
    operator_log, gateway_log = tmp_path / "operator.log", tmp_path / "gateway.log"
    key = _agent_key_file(release, tmp_path / "agent-key")
    operator = _start(
        _chart_command(
            release,
            "sandfleet-operator",
            {"--metrics-port": str(_free_port()), "--liveness": f"http://127.0.0.1:{_free_port()}/healthz"},
        ),
        _account_kubeconfig(release, "sandfleet-operator", tmp_path / "operator.kubeconfig"),
        operator_log,
        release.namespace,
        key,
    )
    port = _free_port()
    gateway = _start(
        _chart_command(release, "sandfleet-gateway", {"--port": str(port), "--host": "127.0.0.1"}),
        _account_kubeconfig(release, "sandfleet-gateway", tmp_path / "gateway.kubeconfig"),
        gateway_log,
        release.namespace,
        key,
    )
    try:
        wait_until(
            lambda: operator.poll() is None and _ready_free(kube, "python") == target,
            timeout=120,
            what=f"{target} warm sandboxes from the operator running as its account",
        )
        wait_until(
            lambda: (kube.json("get", "sandboxpool", "python").get("status") or {}).get("ready") == target,
            timeout=60,
            what="the pool's status written by the operator's account",
        )
        kube("get", "lease", "sandfleet-operator")
        url = f"http://127.0.0.1:{port}"
        wait_until_ready(url, gateway, gateway_log, timeout=60, what="the gateway as its account")
        # The gateway accepts only tokens minted for it (gateway.tokenAudiences: [sandfleet]).
        token = ["-n", release.namespace, "create", "token", "--audience", "sandfleet"]
        user = release.kubectl(*token, "sandfleet-test").strip()
        stranger = release.kubectl(*token, "sandfleet-operator").strip()
        apiserver_token = release.kubectl(
            "-n", release.namespace, "create", "token", "sandfleet-test"
        ).strip()
        with httpx.Client(base_url=url, timeout=60) as http:
            auth = {"Authorization": f"Bearer {user}"}
            acquired = http.post("/v1/leases", json={"pool": "python", "labels": {"run": "r1"}}, headers=auth)
            assert acquired.status_code == 201, acquired.text
            lease_id = acquired.json()["leases"][0]["id"]
            released = http.delete(f"/v1/leases/{lease_id}", headers=auth)
            assert released.status_code == 200, released.text
            policy = http.post("/v1/runs/r1/policy", json={"version": 3}, headers=auth)
            assert policy.status_code in (200, 201), policy.text
            prefetch = http.post(
                "/v1/prefetch",
                json={
                    "pool": "python",
                    "images": [{"image": "localhost/sandfleet/sandbox:0.1.0", "count": 1}],
                },
                headers=auth,
            )
            assert prefetch.status_code < 300, prefetch.text
            # An account without "use" on the pool is turned away (SubjectAccessReview).
            refused = http.post(
                "/v1/leases", json={"pool": "python"}, headers={"Authorization": f"Bearer {stranger}"}
            )
            assert refused.status_code == 403, refused.text
            # A token for the apiserver is not one for the gateway, whoever it names.
            wrong_audience = http.post(
                "/v1/leases", json={"pool": "python"}, headers={"Authorization": f"Bearer {apiserver_token}"}
            )
            assert wrong_audience.status_code == 401, wrong_audience.text
        for log in (operator_log, gateway_log):
            text = log.read_text(errors="replace")
            assert "forbidden" not in text.lower(), f"{log.name}:\n{text[-3000:]}"
    finally:
        _stop(operator)
        _stop(gateway)


def _leftovers(kubectl: Kubectl, namespace: str, release: str) -> list[str]:
    """What the release still has: in its namespace, and its cluster-scoped objects (named after it)."""
    selector = f"app.kubernetes.io/instance={release}"
    kinds = (
        "all,sandboxpools,serviceaccounts,roles,rolebindings,networkpolicies,configmaps,poddisruptionbudgets"
    )
    found = kubectl.in_namespace(namespace)("get", kinds, "-l", selector, "-o", "name").split()
    cluster_kinds = (
        "clusterroles,clusterrolebindings,runtimeclasses,"
        "validatingadmissionpolicies,validatingadmissionpolicybindings"
    )
    cluster = kubectl("get", cluster_kinds, "-l", selector, "-o", "name")
    # Other tests' releases may share the release name; ours carry the namespace in their names.
    return found + [name for name in cluster.split() if namespace in name]


def test_uninstall_leaves_nothing_but_the_crds(kubectl: Kubectl) -> None:
    namespace = _fresh_namespace(kubectl)
    try:
        installed = Release("sf", namespace, kubectl)
        result = installed.helm(
            "install", "sf", str(CHART), *_install_args(namespace), "-f", str(EVERYTHING),
            "--set", "rl.enabled=false", "--set", "metrics.serviceMonitor.enabled=false",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert _leftovers(kubectl, namespace, "sf"), "the install created nothing the check can see"
        result = installed.helm("uninstall", "sf", "--wait", "--timeout", "120s")
        assert result.returncode == 0, result.stderr
        wait_until(
            lambda: not _leftovers(kubectl, namespace, "sf"),
            timeout=60,
            what=f"every object of the release to go: {_leftovers(kubectl, namespace, 'sf')}",
        )
        # helm never deletes CRDs (they hold every user's pools): they stay.
        crds = kubectl("get", "crd", "-o", "name")
        for path in sorted((CHART / "crds").glob("*.yaml")):
            assert yaml.safe_load(path.read_text())["metadata"]["name"] in crds
        assert not installed.helm("list", "-q").stdout.strip()
    finally:
        kubectl("delete", "namespace", namespace, "--wait=false")
