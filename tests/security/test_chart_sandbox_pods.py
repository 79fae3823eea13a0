"""Sandbox Pods as the operator makes them: hardened securityContext, a disk limit, their agent's token,
and the Pod Security levels the apiserver itself grants them (and the chart's own Pods)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sandfleet.core.agent_tokens import AGENT_TOKEN_ENV, agent_token, new_fleet_key
from sandfleet.core.model import pool_from_object
from sandfleet.core.pods import SANDBOX_CAPABILITIES, sandbox_pod
from tests.support.kube import Kubectl, wait_until
from tests.unit.helm.chart import named, objects, pod_templates, render

SANDFLEET = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "sandfleet"
POOL: dict[str, Any] = {
    "metadata": {"namespace": "ns", "name": "python", "uid": "u-1", "generation": 1},
    "spec": {
        "replicas": 1,
        "regions": [{"name": "us-east1"}],
        "template": {
            "image": "sandfleet/sandbox:0.1.0",
            "env": [{"name": "A", "value": "1"}, {"name": AGENT_TOKEN_ENV, "value": "chosen-by-the-pool"}],
        },
    },
}
# Baseline's whole allow-list for added capabilities (Pod Security Standards).
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip


def _pod(key: bytes | None = None, **template: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(POOL))
    body["spec"]["template"].update(template)
    pool = pool_from_object(body)
    return sandbox_pod(
        pool, pool.template, name="python-0a1b2c3d", region="us-east1", zone=None, agent_key=key
    )


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["spec"]["containers"]
    return dict(container)


def test_sandbox_pods_drop_every_capability_but_the_agents_six() -> None:
    context = _container(_pod())["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"], "add": list(SANDBOX_CAPABILITIES)}
    assert set(SANDBOX_CAPABILITIES) == {"CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"}
    assert set(SANDBOX_CAPABILITIES) <= BASELINE_CAPABILITIES
    assert context["allowPrivilegeEscalation"] is False
    assert context["privileged"] is False
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    # uid 0 inside gVisor, said out loud: the agent must switch execs to 1000 and the verifier to 1001.
    assert context["runAsUser"] == 0
    assert context["runAsNonRoot"] is False
    # The task's repository lives in the image and is edited in place (docs/helm.md says why).
    assert context["readOnlyRootFilesystem"] is False
    assert _pod()["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}


def test_sandbox_pods_have_an_ephemeral_storage_limit() -> None:
    resources = _container(_pod())["resources"]
    assert resources["limits"]["ephemeral-storage"] == "2Gi"
    assert resources["requests"]["ephemeral-storage"] == "256Mi"
    # A pool's own figure wins; a request alone is the limit too (never a default limit below it).
    asked = _container(_pod(resources={"requests": {"ephemeral-storage": "5Gi"}}))["resources"]
    assert asked["limits"]["ephemeral-storage"] == asked["requests"]["ephemeral-storage"] == "5Gi"
    capped = _container(_pod(resources={"limits": {"ephemeral-storage": "1Gi"}}))["resources"]
    assert capped["limits"]["ephemeral-storage"] == "1Gi"


def test_sandbox_pods_carry_their_own_agent_token_and_no_pool_can_choose_it() -> None:
    key = new_fleet_key()
    env = {e["name"]: e["value"] for e in _container(_pod(key))["env"]}
    assert env[AGENT_TOKEN_ENV] == agent_token(key, "python-0a1b2c3d")
    assert env["A"] == "1"
    names = [e["name"] for e in _container(_pod(key))["env"]]
    assert names.count(AGENT_TOKEN_ENV) == 1
    # Without a key no token at all (never the pool's): the agent then refuses every call.
    assert AGENT_TOKEN_ENV not in {e["name"] for e in _container(_pod())["env"]}


# -- the chart: the key reaches the operator and the gateway ----------------------------------


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env") or ()}


def test_chart_gives_the_operator_and_gateway_the_fleet_key_and_nobody_else() -> None:
    docs = render()
    secret = named(docs, "Secret", "sandfleet-agent-key")
    assert len(secret["data"]["key"]) >= 64
    pods = pod_templates(docs)
    for name, variable in (
        ("sandfleet-operator", "SANDFLEET_OPERATOR_AGENT_KEY_FILE"),
        ("sandfleet-gateway", "SANDFLEET_GATEWAY_AGENT_KEY_FILE"),
    ):
        spec = pods[name]["spec"]
        assert _env(pods[name])[variable] == "/etc/sandfleet/agent-key/key"
        (volume,) = [v for v in spec["volumes"] if v["name"] == "agent-key"]
        assert volume["secret"]["secretName"] == "sandfleet-agent-key"
        mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
        assert mounts["agent-key"] == {
            "name": "agent-key",
            "mountPath": "/etc/sandfleet/agent-key",
            "readOnly": True,
        }
    for name, pod in pod_templates(render("--set", "rl.enabled=true")).items():
        if name not in ("sandfleet-operator", "sandfleet-gateway"):
            secrets = {v.get("secret", {}).get("secretName") for v in pod["spec"].get("volumes", ())}
            assert "sandfleet-agent-key" not in secrets, name
    existing = render("--set", "agentKey.existingSecret=mine")
    assert not [s for s in objects(existing, "Secret") if s["metadata"]["name"] == "sandfleet-agent-key"]
    volumes = pod_templates(existing)["sandfleet-operator"]["spec"]["volumes"]
    assert {"mine"} == {v["secret"]["secretName"] for v in volumes if v["name"] == "agent-key"}


# -- Pod Security Admission on the real apiserver ---------------------------------------------


def _psa_namespace(kubectl: Kubectl, name: str, level: str) -> Kubectl:
    kubectl("create", "namespace", name)
    kubectl("label", "namespace", name, f"pod-security.kubernetes.io/enforce={level}")
    wait_until(
        lambda: kubectl.run("-n", name, "get", "serviceaccount", "default").returncode == 0,
        timeout=30,
        what=f"the default ServiceAccount in {name}",
    )
    return kubectl.in_namespace(name)


def _dry_run(kube: Kubectl, pod: dict[str, Any]) -> str:
    """Create `pod` with a server-side dry run: '' when admitted, else the apiserver's refusal."""
    result = kube.run("create", "--dry-run=server", "-f", "-", stdin=json.dumps(pod))
    return "" if result.returncode == 0 else result.stderr


@pytest.mark.cluster
def test_pod_security_admits_sandboxes_at_baseline_and_the_charts_pods_at_restricted(
    kubectl: Kubectl, namespace: str, runtime_class: str
) -> None:
    baseline = _psa_namespace(kubectl, f"{namespace}-baseline", "baseline")
    restricted = _psa_namespace(kubectl, f"{namespace}-restricted", "restricted")
    try:
        sandbox = _pod(new_fleet_key(), runtimeClassName=runtime_class)
        del sandbox["metadata"]["ownerReferences"]  # no pool here: the garbage collector would end it
        sandbox["metadata"]["namespace"] = baseline.namespace
        assert _dry_run(baseline, sandbox) == ""
        # Not restricted: uid 0 and six capabilities (why: the agent's uid split, docs/helm.md).
        sandbox["metadata"]["namespace"] = restricted.namespace
        refusal = _dry_run(restricted, sandbox)
        assert "violates PodSecurity" in refusal, refusal
        assert "runAsNonRoot" in refusal, refusal
        # One capability beyond Baseline's list and the sandbox is refused even there.
        widened = json.loads(json.dumps(sandbox))
        widened["metadata"]["namespace"] = baseline.namespace
        widened["spec"]["containers"][0]["securityContext"]["capabilities"]["add"].append("SYS_ADMIN")
        assert "violates PodSecurity" in _dry_run(baseline, widened)
        # Every Pod the chart runs itself (operator, gateway, RL, helm test) meets restricted.
        docs = render("--set", "rl.enabled=true", namespace=str(restricted.namespace))
        accounts = [d for d in docs if d["kind"] == "ServiceAccount"]
        restricted.apply(accounts)
        for name, template in pod_templates(docs).items():
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"psa-{name}"[:63], "namespace": restricted.namespace},
                "spec": template["spec"],
            }
            assert _dry_run(restricted, pod) == "", name
    finally:
        for kube in (baseline, restricted):
            kubectl("delete", "namespace", str(kube.namespace), "--wait=false")


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (None, "no agent key: pass --agent-key-file"),
        ("short", "the agent key has 5 bytes; it needs at least 32"),
    ],
    ids=["missing", "short"],
)
def test_operator_refuses_to_start_without_an_agent_key(
    tmp_path: Path, key: str | None, message: str
) -> None:
    # Sandboxes made without a token would have agents nobody (or anybody) could call: never start.
    argv = [str(SANDFLEET), "operator", "-n", "nowhere", "--metrics-port", "0"]
    if key is not None:
        (tmp_path / "key").write_text(key)
        argv += ["--agent-key-file", str(tmp_path / "key")]
    env = {k: v for k, v in os.environ.items() if k != "SANDFLEET_OPERATOR_AGENT_KEY_FILE"}
    env["KUBECONFIG"] = str(tmp_path / "no-cluster")
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
