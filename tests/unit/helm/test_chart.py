"""The Helm chart offline: CRD copies, lint, renders, schema errors, NetworkPolicies, the dashboard."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from sandfleet.controller import metrics as operator_metrics
from sandfleet.core import api
from sandfleet.core.leases import (
    LeaseRecord,
    lease_metadata,
    release_metadata,
    reserve_metadata,
    unclaim_metadata,
)
from sandfleet.core.model import pool_from_object
from sandfleet.core.pods import sandbox_pod
from sandfleet.gateway.app import ROUTERS
from sandfleet.gateway.metrics import ClusterUp, GatewayMetrics
from tests.unit.helm.chart import (
    CHART,
    EVERYTHING,
    REPO,
    Manifest,
    crd_schemas,
    helm,
    matches,
    named,
    objects,
    pod_templates,
    render,
    render_everything,
)

CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text())
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


# -- the chart's files ------------------------------------------------------------------------


def test_crds_are_byte_identical_copies_of_the_canonical_ones() -> None:
    canonical = {p.name: p.read_bytes() for p in (REPO / "manifests" / "crds").glob("*.yaml")}
    copies = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert canonical, "no CRDs under manifests/crds/"
    assert copies.keys() == canonical.keys(), "helm/sandfleet/crds/ differs: run helm/sync-crds"
    stale = sorted(name for name in canonical if copies[name] != canonical[name])
    assert not stale, f"helm/sandfleet/crds/{stale} differ from manifests/crds/: run helm/sync-crds"


def test_app_version_is_the_package_version() -> None:
    assert CHART_META["apiVersion"] == "v2"
    assert CHART_META["appVersion"] == VERSION


def test_helm_is_the_pinned_version() -> None:
    result = helm("version", "--short")
    assert result.stdout.startswith("v3.22.0"), result.stdout + result.stderr


@pytest.mark.parametrize("values", [None, EVERYTHING], ids=["defaults", "everything"])
def test_lint_strict(values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART)] + (["-f", str(values)] if values else [])
    result = helm(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


# -- renders ----------------------------------------------------------------------------------


def kinds(docs: list[Manifest]) -> set[str]:
    return {d["kind"] for d in docs}


def test_defaults_render_the_core_and_leave_the_optional_parts_out() -> None:
    docs = render()
    assert {
        "Deployment",
        "Service",
        "ServiceAccount",
        "ClusterRole",
        "Role",
        "NetworkPolicy",
        "RuntimeClass",
        "SandboxPool",
        "PodDisruptionBudget",
        "ConfigMap",
        "Pod",
    } <= kinds(docs)
    assert not {"ServiceMonitor", "HorizontalPodAutoscaler"} & kinds(docs)
    assert sorted(d["metadata"]["name"] for d in objects(docs, "Deployment")) == [
        "sandfleet-gateway",
        "sandfleet-operator",
    ]


def test_everything_renders_every_optional_part() -> None:
    docs = render_everything()
    assert {"ServiceMonitor", "HorizontalPodAutoscaler"} <= kinds(docs)
    deployments = {d["metadata"]["name"] for d in objects(docs, "Deployment")}
    assert deployments == {"sandfleet-gateway", "sandfleet-operator", "sandfleet-learner", "sandfleet-actor"}
    # With an HPA, the Deployment leaves replicas to it (helm upgrade must not reset them).
    assert "replicas" not in named(docs, "Deployment", "sandfleet-gateway")["spec"]
    monitor = objects(docs, "ServiceMonitor")[0]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {"http", "metrics"}


def test_every_object_is_namespaced_to_the_release_or_cluster_scoped() -> None:
    cluster_scoped = {
        "ClusterRole",
        "ClusterRoleBinding",
        "RuntimeClass",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for doc in render_everything(namespace="team-a"):
        if doc["kind"] in cluster_scoped:
            assert "namespace" not in doc["metadata"]
            if doc["kind"] != "RuntimeClass":
                # Two releases in two namespaces must not fight over one cluster-wide name.
                assert doc["metadata"]["name"].startswith("team-a-")
        else:
            assert doc["metadata"]["namespace"] == "team-a", doc["metadata"]["name"]


def test_images_default_to_the_app_version() -> None:
    docs = render_everything()
    for name, pod in pod_templates(docs).items():
        for container in pod["spec"]["containers"]:
            assert container["image"] == f"localhost/sandfleet/sandfleet:{VERSION}", name
            assert container["imagePullPolicy"] == "IfNotPresent"
    python = named(docs, "SandboxPool", "python")
    assert python["spec"]["template"]["image"] == f"localhost/sandfleet/sandbox:{VERSION}"
    assert named(docs, "SandboxPool", "rl-tasks")["spec"]["template"]["image"].endswith("tasks-ci:0.1.0")


def test_image_tag_override() -> None:
    docs = render("--set", "image.tag=dev", "--set", "sandbox.image.tag=dev2")
    operator = named(docs, "Deployment", "sandfleet-operator")
    assert operator["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":dev")
    assert named(docs, "SandboxPool", "python")["spec"]["template"]["image"].endswith(":dev2")


@pytest.mark.parametrize("everything", [False, True], ids=["defaults", "everything"])
def test_every_sandbox_pool_validates_against_its_crd(everything: bool) -> None:
    docs = render_everything() if everything else render()
    schemas = crd_schemas()
    pools = objects(docs, "SandboxPool")
    assert pools
    for pool in pools:
        jsonschema.validate(pool, schemas[(pool["apiVersion"], pool["kind"])])
        template = pool["spec"]["template"]
        assert template["runtimeClassName"] == "gvisor"
        assert template["agentPort"] == 8000


def test_runtime_class_scheduling_reaches_the_pools() -> None:
    # The planner counts only nodes a pool's nodeSelector admits: it must see the runsc nodes.
    docs = render_everything()
    runtime_class = objects(docs, "RuntimeClass")[0]
    assert runtime_class["handler"] == "runsc"
    selector = runtime_class["scheduling"]["nodeSelector"]
    for pool in objects(docs, "SandboxPool"):
        assert selector.items() <= pool["spec"]["template"]["nodeSelector"].items()
        assert runtime_class["scheduling"]["tolerations"][0] in pool["spec"]["template"]["tolerations"]


def test_operator_deployment() -> None:
    docs = render()
    deployment = named(docs, "Deployment", "sandfleet-operator")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["sandfleet", "operator"]
    assert "--namespace=sandfleet" in container["args"]
    assert "--metrics-port=8080" in container["args"]
    assert any(a.startswith("--liveness=http://0.0.0.0:8081/") for a in container["args"])
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"metrics": 8080, "health": 8081}
    assert pod["serviceAccountName"] == "sandfleet-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_gateway_deployment_probes_and_flags() -> None:
    docs = render()
    pod = named(docs, "Deployment", "sandfleet-gateway")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["sandfleet", "gateway"]
    assert {"--namespace=sandfleet", "--auth=kubernetes", "--port=8080"} <= set(container["args"])
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["enableServiceLinks"] is False
    service = named(docs, "Service", "sandfleet-gateway")
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}
    ]
    assert named(docs, "PodDisruptionBudget", "sandfleet-gateway")["spec"]["minAvailable"] == 1


@pytest.mark.parametrize(("args", "cluster"), [([], "default"), (["--set", "clusterName=eu1"], "eu1")])
def test_the_cluster_name_labels_the_operators_and_the_gateways_metrics(
    args: list[str], cluster: str
) -> None:
    env = {
        name: {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        for name, pod in pod_templates(render(*args)).items()
    }
    assert env["sandfleet-operator"]["SANDFLEET_CLUSTER"] == cluster
    assert env["sandfleet-gateway"]["SANDFLEET_GATEWAY_CLUSTER"] == cluster


def test_a_gateway_audience_reaches_the_gateway_and_the_rl_tokens() -> None:
    plain = named(render(), "Deployment", "sandfleet-gateway")["spec"]["template"]["spec"]
    assert [a for a in plain["containers"][0]["args"] if a.startswith("--token-audience")] == [
        "--token-audience=sandfleet"
    ]
    # Opened on purpose: any ServiceAccount token (the apiserver's audiences).
    opened = named(render("--set-json", "gateway.tokenAudiences=[]"), "Deployment", "sandfleet-gateway")
    assert not [
        a
        for a in opened["spec"]["template"]["spec"]["containers"][0]["args"]
        if a.startswith("--token-audience")
    ]
    docs = render("-f", str(EVERYTHING), "--set", "gateway.tokenAudiences={sandfleet-gateway}")
    gateway = named(docs, "Deployment", "sandfleet-gateway")["spec"]["template"]["spec"]
    assert "--token-audience=sandfleet-gateway" in gateway["containers"][0]["args"]
    for name in ("sandfleet-actor", "sandfleet-learner"):
        pod = named(docs, "Deployment", name)["spec"]["template"]["spec"]
        token = next(v for v in pod["volumes"] if v["name"] == "gateway-token")
        assert token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == "sandfleet-gateway"


def test_gateway_serves_what_app_py_routes() -> None:
    # The probes' paths must exist in the app (a renamed route would leave Pods never Ready).
    served = {route.path for router in ROUTERS for route in router.routes if isinstance(route, APIRoute)}
    gateway = named(render(), "Deployment", "sandfleet-gateway")["spec"]["template"]["spec"]
    container = gateway["containers"][0]
    probes = {container[probe]["httpGet"]["path"] for probe in ("readinessProbe", "livenessProbe")}
    assert probes == {"/readyz", "/healthz"}
    assert probes <= served


def test_static_auth_mounts_the_token_secret() -> None:
    docs = render(
        "--set", "gateway.auth=static", "--set", "gateway.staticTokens.secretName=tokens",
        "--set", "tests.tokenSecret.name=test-token",
    )  # fmt: skip
    pod = named(docs, "Deployment", "sandfleet-gateway")["spec"]["template"]["spec"]
    assert "--token-file=/etc/sandfleet/tokens/tokens" in pod["containers"][0]["args"]
    assert pod["volumes"][-1]["secret"]["secretName"] == "tokens"
    # No TokenReview permissions without Kubernetes auth.
    assert not [d for d in objects(docs, "ClusterRole") if "gateway" in d["metadata"]["name"]]
    test_pod = objects(docs, "Pod")[0]
    token = {e["name"]: e for e in test_pod["spec"]["containers"][0]["env"]}["SANDFLEET_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"] == {"name": "test-token", "key": "token"}


def test_rl_deployments_find_the_gateway_and_learner_without_dns() -> None:
    docs = render_everything()
    learner_service = named(docs, "Service", "sandfleet-rl-learner")
    assert learner_service["spec"]["ports"][0]["name"] == "http"
    for name in ("sandfleet-actor", "sandfleet-learner"):
        pod = named(docs, "Deployment", name)["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        gateway = "http://$(SANDFLEET_GATEWAY_SERVICE_HOST):$(SANDFLEET_GATEWAY_SERVICE_PORT_HTTP)"
        assert env["SANDFLEET_GATEWAY_URL"] == gateway
        assert env["SANDFLEET_TOKEN_FILE"] == "/var/run/secrets/sandfleet/token"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert pod["nodeSelector"] == {api.REGION_LABEL: "us-east1"}
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
        assert pod["automountServiceAccountToken"] is False
        token = next(v for v in pod["volumes"] if v["name"] == "gateway-token")
        assert token["projected"]["sources"][0]["serviceAccountToken"]["path"] == "token"
    actor = named(docs, "Deployment", "sandfleet-actor")["spec"]["template"]["spec"]["containers"][0]
    assert actor["command"] == ["sandfleet", "rl", "actor"]
    learner_url = {e["name"]: e.get("value") for e in actor["env"]}["SANDFLEET_LEARNER_URL"]
    assert (
        learner_url == "http://$(SANDFLEET_RL_LEARNER_SERVICE_HOST):$(SANDFLEET_RL_LEARNER_SERVICE_PORT_HTTP)"
    )


def test_gateway_url_is_overridable() -> None:
    docs = render("-f", str(EVERYTHING), "--set", "rl.gatewayURL=http://gw.example:80")
    actor = named(docs, "Deployment", "sandfleet-actor")["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in actor["env"]}[
        "SANDFLEET_GATEWAY_URL"
    ] == "http://gw.example:80"


def service_link_names(service: str) -> set[str]:
    """The environment variables Kubernetes derives from a Service name (docker-link style too)."""
    prefix = service.upper().replace("-", "_")
    return {f"{prefix}_SERVICE_HOST", f"{prefix}_SERVICE_PORT", f"{prefix}_PORT"}


def names_the_code_reads(command: list[str]) -> set[str]:
    """SANDFLEET_* variables read anywhere in the package, plus the settings classes' of a server."""
    from pydantic_settings import BaseSettings

    from sandfleet.cli.settings_flags import environment_names
    from sandfleet.controller.settings import OperatorSettings
    from sandfleet.gateway.settings import CapacitySettings, GatewaySettings, TenantSettings

    source = "\n".join(p.read_text() for p in (REPO / "operator" / "sandfleet").rglob("*.py"))
    names = set(re.findall(r"\bSANDFLEET_[A-Z_]*[A-Z]\b", source))
    servers: dict[str, list[type[BaseSettings]]] = {
        "gateway": [GatewaySettings, CapacitySettings, TenantSettings],
        "operator": [OperatorSettings],
        "serve": [CapacitySettings, TenantSettings],
    }
    if command[:1] == ["sandfleet"] and len(command) > 1:
        for settings in servers.get(command[1], []):
            names |= {name for variables in environment_names(settings).values() for name in variables}
    return names


@pytest.mark.parametrize("release", ["sandfleet", "x"])
def test_service_variables_never_reach_settings_the_code_reads(release: str) -> None:
    # A Service named sandfleet-learner gives every Pod SANDFLEET_LEARNER_PORT=tcp://...: a Pod that
    # keeps service links must set each such name the code reads itself (explicit env wins).
    docs = render_everything(release=release)
    linked: set[str] = set()
    for service in objects(docs, "Service"):
        linked |= service_link_names(service["metadata"]["name"])
    for name, pod in pod_templates(docs).items():
        if pod["spec"].get("enableServiceLinks") is False:
            continue
        for container in pod["spec"]["containers"]:
            explicit = {e["name"] for e in container.get("env") or ()}
            clash = (linked & names_the_code_reads(container.get("command") or [])) - explicit
            assert not clash, f"{name}: Service variables {sorted(clash)} would reach the code"


def test_the_gateway_and_operator_get_no_service_variables() -> None:
    pods = pod_templates(render())
    for name in ("sandfleet-gateway", "sandfleet-operator"):
        assert pods[name]["spec"]["enableServiceLinks"] is False, name


def test_helm_test_pod_leases_execs_and_releases() -> None:
    docs = render()
    pod = objects(docs, "Pod")[0]
    annotations = pod["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "test"
    # helm uninstall never deletes hook objects: a passed test must not leave its Pod behind.
    assert "hook-succeeded" in annotations["helm.sh/hook-delete-policy"].split(",")
    assert "hook-succeeded" in annotations["helm.sh/hook-output-log-policy"].split(",")
    container = pod["spec"]["containers"][0]
    script = container["args"][0]
    for step in ("sandfleet lease", "sandfleet exec", "sandfleet release", "trap"):
        assert step in script
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["POOL"] == "python"
    assert env["SANDFLEET_TOKEN_FILE"] == "/var/run/secrets/sandfleet/token"
    assert pod["spec"]["serviceAccountName"] == "sandfleet-test"
    binding = named(docs, "RoleBinding", "sandfleet-pool-user")
    assert {"kind": "ServiceAccount", "name": "sandfleet-test", "namespace": "sandfleet"} in binding[
        "subjects"
    ]


def test_pool_user_role_grants_use_on_the_chart_pools_only() -> None:
    docs = render_everything()
    (rule,) = named(docs, "Role", "sandfleet-pool-user")["rules"]
    assert rule == {
        "apiGroups": ["sandfleet.dev"],
        "resources": ["sandboxpools"],
        "resourceNames": ["python", "rl-tasks"],
        "verbs": ["use"],
    }
    subjects = named(docs, "RoleBinding", "sandfleet-pool-user")["subjects"]
    assert {s["name"] for s in subjects} == {"rollout-workers", "sandfleet-rl", "sandfleet-test"}


def test_sandbox_service_account_has_no_token_and_the_pools_use_it() -> None:
    docs = render()
    account = named(docs, "ServiceAccount", "sandfleet-sandbox")
    assert account["automountServiceAccountToken"] is False
    for pool in objects(docs, "SandboxPool"):
        assert pool["spec"]["template"]["serviceAccountName"] == "sandfleet-sandbox"
    without = render("--set", "sandbox.serviceAccount.create=false")
    assert all("serviceAccountName" not in p["spec"]["template"] for p in objects(without, "SandboxPool"))


def cli_params(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What the real `sandfleet` CLI parses from a container's command line and environment."""
    from typer.main import get_command

    from sandfleet.cli import app

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert argv[0] == "sandfleet", argv
    command: Any = get_command(app)
    name, words, parent = "sandfleet", argv[1:], None
    while True:
        ctx = command.make_context(name, list(words), parent=parent)
        if not hasattr(command, "resolve_command"):
            params: dict[str, Any] = ctx.params
            return params
        name, command, words = command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        parent = ctx


def server_settings(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The settings `sandfleet operator` or `sandfleet gateway` builds from a command line and env.

    Flags, then variables, then defaults; caught where the command would start the server.
    """
    from typer.testing import CliRunner

    import sandfleet.controller.main
    import sandfleet.gateway.main
    from sandfleet.cli import app

    seen: list[Any] = []
    monkeypatch.setattr(sandfleet.controller.main, "run", lambda settings, *_: seen.append(settings))
    monkeypatch.setattr(sandfleet.gateway.main, "run", lambda settings, *_: seen.append(settings))
    result = CliRunner().invoke(app, argv[1:], env=env)
    assert result.exit_code == 0, result.output
    return seen[0]


def test_every_sandfleet_container_line_parses_with_the_real_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    # An unknown flag or a badly typed variable would crash-loop the Pod; the CLI says so here.
    parsed = {}
    settings = {}
    for name, pod in pod_templates(render_everything(tests=False)).items():
        container = pod["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container.get("env") or () if "value" in e}
        argv = [*container["command"], *container.get("args", [])]
        with monkeypatch.context() as scoped:
            parsed[name] = cli_params(argv, env, scoped)
        if argv[1] in ("operator", "gateway"):  # their settings classes read the rest
            with monkeypatch.context() as scoped:
                settings[name] = server_settings(argv, env, scoped)
    assert settings["sandfleet-operator"].namespaces == ("sandfleet",)
    assert settings["sandfleet-operator"].liveness == "http://0.0.0.0:8081/healthz"
    assert settings["sandfleet-operator"].cluster == "default"
    assert settings["sandfleet-operator"].log_level == "INFO"
    assert settings["sandfleet-gateway"].auth == "kubernetes"
    assert settings["sandfleet-gateway"].cluster == "default"
    assert parsed["sandfleet-learner"]["host"] == "0.0.0.0"
    assert parsed["sandfleet-learner"]["port"] == 8500
    assert parsed["sandfleet-learner"]["device"] == "auto"
    assert parsed["sandfleet-learner"]["token_file"] == Path("/var/run/secrets/sandfleet/token")
    assert parsed["sandfleet-actor"]["pool"] == "rl-tasks"
    assert parsed["sandfleet-actor"]["run_name"] == "sandfleet"
    assert parsed["sandfleet-actor"]["learner_url"].startswith("http://$(SANDFLEET_RL_LEARNER_SERVICE_HOST)")
    assert parsed["sandfleet-actor"]["url"].startswith("http://$(SANDFLEET_GATEWAY_SERVICE_HOST)")


@pytest.mark.parametrize(
    ("args", "absent"),
    [
        (
            ["--set", "gateway.enabled=false"],
            {"sandfleet-gateway", "sandfleet-test-lease", "sandfleet-pool-user"},
        ),
        (["--set", "operator.enabled=false"], {"sandfleet-operator", "sandfleet-operator-metrics"}),
        (["--set", "runtimeClass.create=false", "--set", "sandbox.serviceAccount.create=false"], {"gvisor"}),
        (["--set", "tests.enabled=false"], {"sandfleet-test-lease", "sandfleet-test"}),
        (["--set", "pools=null", "--set", "tests.enabled=false"], {"python"}),
    ],
    ids=["no-gateway", "no-operator", "no-runtimeclass", "no-tests", "no-pools"],
)
def test_parts_turn_off_cleanly(args: list[str], absent: set[str]) -> None:
    names = {d["metadata"]["name"] for d in render(*args)}
    assert not names & absent
    assert names, "nothing rendered"


# -- RBAC -------------------------------------------------------------------------------------


def rules_of(docs: list[Manifest], account: str) -> list[tuple[str, dict[str, Any]]]:
    """(scope, rule) for every rule bound to ServiceAccount `account`: scope is a namespace or '*'."""
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")}
    found = []
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == account for s in binding["subjects"]):
            continue
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        scope = binding["metadata"].get("namespace", "*")
        found += [(scope, rule) for rule in role["rules"]]
    return found


def allowed(
    docs: list[Manifest], account: str, verb: str, resource: str, namespace: str, name: str = ""
) -> bool:
    """RBAC's answer for `resource` written plural[.group][/subresource], in `namespace` ('' = cluster)."""
    main, _, sub = resource.partition("/")
    plural, _, group = main.partition(".")
    wanted = f"{plural}/{sub}" if sub else plural
    for scope, rule in rules_of(docs, account):
        if scope not in ("*", namespace):
            continue
        if group not in rule["apiGroups"] or wanted not in rule["resources"] or verb not in rule["verbs"]:
            continue
        if rule.get("resourceNames") and name not in rule["resourceNames"]:
            continue
        return True
    return False


OPERATOR_NEEDS = [
    # controller/kube.py: Pod and Node informers (cluster-wide), sandbox writes, status, events,
    # leader election; kopf: pools, pre-warms, namespaces and CRDs.
    ("list", "pods", "other"),
    ("watch", "nodes", ""),
    ("create", "pods", "sandfleet"),
    ("delete", "pods", "sandfleet"),
    ("create", "events", "sandfleet"),
    ("watch", "sandboxpools.sandfleet.dev", "sandfleet"),
    ("list", "sandboxprewarms.sandfleet.dev", "sandfleet"),
    ("patch", "sandboxpools.sandfleet.dev/status", "sandfleet"),
    ("create", "leases.coordination.k8s.io", "sandfleet"),
    ("update", "leases.coordination.k8s.io", "sandfleet", "sandfleet-operator"),
    ("watch", "customresourcedefinitions.apiextensions.k8s.io", ""),
    ("watch", "sandboxledgers.sandfleet.dev", "sandfleet"),
    ("patch", "sandboxledgers.sandfleet.dev", "sandfleet"),
]
OPERATOR_MUST_NOT = [
    ("create", "pods", "other"),
    ("delete", "pods", "other"),
    ("patch", "pods", "sandfleet"),
    ("get", "secrets", "sandfleet"),
    ("update", "leases.coordination.k8s.io", "sandfleet", "someone-elses-lease"),
    ("patch", "sandboxpools.sandfleet.dev", "sandfleet"),
    ("patch", "sandboxledgers.sandfleet.dev", "other"),
    ("delete", "sandboxledgers.sandfleet.dev", "sandfleet"),
]
GATEWAY_NEEDS = [
    ("watch", "pods", "sandfleet"),
    ("patch", "pods", "sandfleet"),
    ("list", "sandboxpools.sandfleet.dev", "sandfleet"),
    ("patch", "sandboxprewarms.sandfleet.dev", "sandfleet"),
    ("update", "configmaps", "sandfleet"),
    ("watch", "leases.coordination.k8s.io", "sandfleet"),
    ("patch", "leases.coordination.k8s.io", "sandfleet"),
    ("create", "tokenreviews.authentication.k8s.io", ""),
    ("create", "subjectaccessreviews.authorization.k8s.io", ""),
    ("watch", "sandboxledgers.sandfleet.dev", "sandfleet"),
    ("create", "sandboxledgers.sandfleet.dev", "sandfleet"),
    ("patch", "sandboxledgers.sandfleet.dev", "sandfleet"),
]
GATEWAY_MUST_NOT = [
    ("list", "pods", "other"),
    ("delete", "pods", "sandfleet"),
    ("create", "pods", "sandfleet"),
    ("get", "secrets", "sandfleet"),
    ("patch", "sandboxpools.sandfleet.dev/status", "sandfleet"),
    ("patch", "leases.coordination.k8s.io", "other"),
    ("delete", "sandboxledgers.sandfleet.dev", "sandfleet"),
    ("patch", "sandboxledgers.sandfleet.dev", "other"),
]


def _check(account: str, case: tuple[str, ...], expected: bool) -> None:
    verb, resource, namespace, *name = case
    got = allowed(render_everything(), account, verb, resource, namespace, *name)
    assert got is expected, f"{account} {'cannot' if expected else 'can'} {case}"


@pytest.mark.parametrize("case", OPERATOR_NEEDS, ids=str)
def test_operator_may(case: tuple[str, ...]) -> None:
    _check("sandfleet-operator", case, True)


@pytest.mark.parametrize("case", OPERATOR_MUST_NOT, ids=str)
def test_operator_may_not(case: tuple[str, ...]) -> None:
    _check("sandfleet-operator", case, False)


@pytest.mark.parametrize("case", GATEWAY_NEEDS, ids=str)
def test_gateway_may(case: tuple[str, ...]) -> None:
    _check("sandfleet-gateway", case, True)


@pytest.mark.parametrize("case", GATEWAY_MUST_NOT, ids=str)
def test_gateway_may_not(case: tuple[str, ...]) -> None:
    _check("sandfleet-gateway", case, False)


# A fleet gateway's account in a member (fleetMember.enabled): the gateway's rights, and its pools'
# fleet-share annotation (the admission policy holds it to that annotation).
FLEET_GATEWAY_NEEDS = [*GATEWAY_NEEDS, ("patch", "sandboxpools.sandfleet.dev", "sandfleet")]


@pytest.mark.parametrize("case", FLEET_GATEWAY_NEEDS, ids=str)
def test_a_fleet_gateway_may(case: tuple[str, ...]) -> None:
    _check("sandfleet-fleet-gateway", case, True)


@pytest.mark.parametrize("case", GATEWAY_MUST_NOT, ids=str)
def test_a_fleet_gateway_may_not(case: tuple[str, ...]) -> None:
    _check("sandfleet-fleet-gateway", case, False)


def test_a_fleet_gateway_mounts_each_members_kubeconfig_and_reaches_it() -> None:
    docs = render_everything()
    pod = named(docs, "Deployment", "sandfleet-gateway")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    members = [a for a in container["args"] if a.startswith("--member")]
    assert members == [
        "--member=eu1=/etc/sandfleet/members/eu1/kubeconfig",
        "--member=us2=/etc/sandfleet/members/us2/config",
        "--member-weight=us2=2.5",
    ]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["member-us2"] == {
        "name": "member-us2",
        "mountPath": "/etc/sandfleet/members/us2",
        "readOnly": True,
    }
    assert volumes["member-us2"]["secret"] == {
        "secretName": "sandfleet-member-us2",
        "items": [{"key": "config", "path": "config"}],
    }
    egress = named(docs, "NetworkPolicy", "sandfleet-gateway")["spec"]["egress"]
    assert {"to": [{"ipBlock": {"cidr": "10.0.9.1/32"}}], "ports": [
        {"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]} in egress  # fmt: skip
    assert {
        "to": [{"ipBlock": {"cidr": "10.245.0.0/16"}}],
        "ports": [{"protocol": "TCP", "port": 8000}],
    } in egress


def test_a_fleet_member_makes_the_fleet_gateways_account_and_its_token() -> None:
    docs = render_everything()
    token = named(docs, "Secret", "sandfleet-fleet-gateway")
    assert token["type"] == "kubernetes.io/service-account-token"
    assert token["metadata"]["annotations"] == {
        "kubernetes.io/service-account.name": "sandfleet-fleet-gateway"
    }
    assert named(docs, "ServiceAccount", "sandfleet-fleet-gateway")
    policy = named(docs, "ValidatingAdmissionPolicy", "sandfleet-sandfleet-gateway-writes")
    assert (
        "system:serviceaccount:sandfleet:sandfleet-fleet-gateway"
        in policy["spec"]["matchConditions"][0]["expression"]
    )
    assert any("fleet-share" in v["expression"] for v in policy["spec"]["validations"])
    assert not [d for d in render() if "sandfleet-fleet-gateway" in d["metadata"]["name"]]  # off by default


def test_rl_and_sandbox_accounts_have_no_api_permissions_but_pool_use() -> None:
    docs = render_everything()
    assert [r["verbs"] for _, r in rules_of(docs, "sandfleet-rl")] == [["use"]]
    assert rules_of(docs, "sandfleet-sandbox") == []


# -- values.schema.json -----------------------------------------------------------------------

BAD_VALUES = [
    (["--set", "operator.replicas=-1"], "at '/operator/replicas': minimum: got -1, want 0"),
    (
        ["--set", "gateway.auth=ldap"],
        "at '/gateway/auth': value must be one of 'kubernetes', 'static', 'none'",
    ),
    (["--set", "gateway.port=70000"], "at '/gateway/port': maximum: got 70,000, want 65,535"),
    (["--set", "replicas=3"], "additional properties 'replicas' not allowed"),
    (["--set", "gateway.replica=3"], "at '/gateway': additional properties 'replica' not allowed"),
    (["--set", "image.pullPolicy=Sometimes"], "at '/image/pullPolicy': value must be one of"),
    (["--set", "pools[0].regions[0].weight=0"], "at '/pools/0/regions/0/weight': minimum: got 0, want 1"),
    (["--set", "pools[0].name=Not_A_Name"], "at '/pools/0/name'"),
    (["--set", "rl.learner.device=tpu"], "at '/rl/learner/device': value must be one of"),
    (["--set", "rl.learner.replicas=2"], "at '/rl/learner/replicas': maximum: got 2, want 1"),
    (
        ["--set", "networkPolicy.sandboxes.egress[0].cidr=everywhere"],
        "at '/networkPolicy/sandboxes/egress/0/cidr'",
    ),
    (["--set-string", "operator.metricsPort=http"], "at '/operator/metricsPort': got string, want integer"),
    (
        ["--set-json", 'gateway.members=[{"name": "EU_1", "secretName": "m"}]'],
        "at '/gateway/members/0/name'",
    ),
    (["--set", "clusterName=EU_1"], "at '/clusterName'"),
]


@pytest.mark.parametrize(("args", "message"), BAD_VALUES, ids=[" ".join(args) for args, _ in BAD_VALUES])
def test_schema_rejects_bad_values_with_a_clear_message(args: list[str], message: str) -> None:
    result = helm("template", "x", str(CHART), *args)
    assert result.returncode != 0, f"helm accepted {args}"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "gateway.auth=static"], "gateway.auth=static needs gateway.staticTokens.secretName"),
        (["--set", "pools=null"], "tests.enabled needs a pool"),
    ],
)
def test_inconsistent_values_fail_with_what_to_set(args: list[str], message: str) -> None:
    result = helm("template", "x", str(CHART), *args)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


# -- NetworkPolicies --------------------------------------------------------------------------


def a_sandbox_pod(docs: list[Manifest]) -> Manifest:
    """A sandbox Pod exactly as the operator builds it (core/pods.py) for the chart's first pool."""
    body = {**objects(docs, "SandboxPool")[0]}
    body["metadata"] = {**body["metadata"], "uid": "u-1"}
    pool = pool_from_object(body)
    return sandbox_pod(pool, pool.template, name="python-abc", region="us-east1", zone=None)


def policies_selecting(docs: list[Manifest], labels: dict[str, str]) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in objects(docs, "NetworkPolicy")
        if matches(p["spec"]["podSelector"], labels)
    ]


def test_every_pod_is_selected_by_exactly_its_own_policy() -> None:
    docs = render_everything()
    sandbox = a_sandbox_pod(docs)
    assert policies_selecting(docs, sandbox["metadata"]["labels"]) == ["sandfleet-sandboxes"]
    expected = {
        "sandfleet-operator": ["sandfleet-operator"],
        "sandfleet-gateway": ["sandfleet-gateway"],
        "sandfleet-learner": ["sandfleet-learner"],
        "sandfleet-actor": ["sandfleet-actor"],
        "sandfleet-test-lease": [],
    }
    for name, pod in pod_templates(docs).items():
        assert policies_selecting(docs, pod["metadata"]["labels"]) == expected[name], name


def test_sandboxes_take_ingress_only_from_the_gateway_on_the_agent_port() -> None:
    docs = render_everything()
    policy = named(docs, "NetworkPolicy", "sandfleet-sandboxes")["spec"]
    sandbox = a_sandbox_pod(docs)
    agent_port = sandbox["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": agent_port}]
    pods = pod_templates(docs)
    pod_peers = [p["podSelector"] for p in rule["from"] if "podSelector" in p]
    admitted = {
        name for name, pod in pods.items() if any(matches(s, pod["metadata"]["labels"]) for s in pod_peers)
    }
    assert admitted == {"sandfleet-gateway"}
    # Nor does one sandbox reach another.
    assert not any(matches(s, sandbox["metadata"]["labels"]) for s in pod_peers)


def test_sandbox_egress_is_denied_unless_allowed() -> None:
    defaults = named(render(), "NetworkPolicy", "sandfleet-sandboxes")["spec"]
    assert "Egress" in defaults["policyTypes"]
    assert defaults["egress"] == []
    allowed_ = named(render_everything(), "NetworkPolicy", "sandfleet-sandboxes")["spec"]["egress"]
    assert allowed_ == [
        {
            "to": [{"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.1.0/24"]}}],
            "ports": [{"protocol": "TCP", "port": 443}],
        }
    ]


def test_gateway_reaches_the_apiserver_and_the_sandboxes_only() -> None:
    docs = render("--set", "networkPolicy.apiServer.cidrs={10.0.0.1/32}")
    policy = named(docs, "NetworkPolicy", "sandfleet-gateway")["spec"]
    sandbox = a_sandbox_pod(docs)
    to_pods = [r for r in policy["egress"] if any("podSelector" in p for p in r["to"])]
    assert len(to_pods) == 2
    to_sandboxes, to_replicas = to_pods
    assert matches(to_sandboxes["to"][0]["podSelector"], sandbox["metadata"]["labels"])
    assert to_sandboxes["ports"] == [{"protocol": "TCP", "port": 8000}]
    # The other replicas, on the gateway's port only: a run's profile gathers their share of its spans.
    gateway = pod_templates(docs)["sandfleet-gateway"]
    assert matches(to_replicas["to"][0]["podSelector"], gateway["metadata"]["labels"])
    assert not matches(to_replicas["to"][0]["podSelector"], sandbox["metadata"]["labels"])
    assert to_replicas["ports"] == [{"protocol": "TCP", "port": 8080}]
    apiserver = [r for r in policy["egress"] if any("ipBlock" in p for p in r["to"])]
    assert {p["port"] for p in apiserver[0]["ports"]} == {443, 6443}
    # No DNS by default (the local cluster has none); with DNS on, port 53 to kube-dns only.
    assert all(p["port"] != 53 for r in policy["egress"] for p in r.get("ports", []))
    with_dns = named(render_everything(), "NetworkPolicy", "sandfleet-gateway")["spec"]["egress"]
    dns = [r for r in with_dns if any(p["port"] == 53 for p in r["ports"])]
    assert dns[0]["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}


def test_gateway_ingress_restricted_still_admits_the_charts_own_clients() -> None:
    docs = render_everything()
    (rule,) = named(docs, "NetworkPolicy", "sandfleet-gateway")["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8080}]
    pods = pod_templates(docs)
    selectors = [p["podSelector"] for p in rule["from"] if "podSelector" in p]
    admitted = {
        name for name, pod in pods.items() if any(matches(s, pod["metadata"]["labels"]) for s in selectors)
    }
    # The charts' clients, and the replicas themselves (a profile asks the others for their spans).
    assert admitted == {"sandfleet-actor", "sandfleet-learner", "sandfleet-test-lease", "sandfleet-gateway"}
    # Restricted by default too: Pods labelled as sandfleet clients, and the chart's own.
    (default_rule,) = named(render(), "NetworkPolicy", "sandfleet-gateway")["spec"]["ingress"]
    assert {"podSelector": {"matchLabels": {"sandfleet.dev/client": "true"}}} in default_rule["from"]
    # With no client admitted at all, the replicas still are, and nobody else (never an empty `from`).
    (alone,) = named(
        render("--set", "networkPolicy.gatewayFrom=null", "--set", "tests.enabled=false"),
        "NetworkPolicy",
        "sandfleet-gateway",
    )["spec"]["ingress"]
    assert [p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in alone["from"]] == [
        "gateway"
    ]


def test_actors_reach_the_gateway_and_the_learner() -> None:
    docs = render_everything()
    pods = pod_templates(docs)
    egress = named(docs, "NetworkPolicy", "sandfleet-actor")["spec"]["egress"]
    reached = {
        (name, port["port"])
        for rule in egress
        for peer in rule["to"]
        if "podSelector" in peer
        for name, pod in pods.items()
        if matches(peer["podSelector"], pod["metadata"]["labels"])
        for port in rule["ports"]
    }
    assert reached == {("sandfleet-gateway", 8080), ("sandfleet-learner", 8500)}
    (ingress,) = named(docs, "NetworkPolicy", "sandfleet-learner")["spec"]["ingress"]
    assert matches(ingress["from"][0]["podSelector"], pods["sandfleet-actor"]["metadata"]["labels"])


def test_network_policies_can_be_turned_off() -> None:
    assert not objects(render("--set", "networkPolicy.enabled=false"), "NetworkPolicy")


# -- the dashboard ----------------------------------------------------------------------------


def exposed_metric_names() -> set[str]:
    """Every series name the operator and the gateway can expose, from their real definitions."""
    families = list(GatewayMetrics(registry=CollectorRegistry()).registry.collect())
    families += list(ClusterUp(lambda: {"default": True}).collect())  # a fleet gateway's too
    families += [
        next(iter(value.describe()))
        for value in vars(operator_metrics).values()
        if isinstance(value, MetricWrapperBase)
    ]
    suffixes = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",), "info": ("_info",)}
    names = set()
    for family in families:
        for suffix in suffixes.get(family.type, ("",)):
            names.add(family.name + suffix)
    return names


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CHART / "files" / "dashboard.json").read_text())
    return data


def queries(board: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", ())]
    exprs += [v["definition"] for v in board["templating"]["list"] if v.get("definition")]
    return exprs


def test_dashboard_queries_only_metrics_the_code_defines() -> None:
    known = exposed_metric_names()
    assert "sandfleet_sandbox_startup_seconds_bucket" in known
    used = {name for expr in queries(dashboard()) for name in re.findall(r"\bsandfleet_[a-z_]+", expr)}
    assert used, "the dashboard queries nothing"
    unknown = sorted(used - known)
    assert not unknown, f"the dashboard queries metrics no component defines: {unknown}"


def test_dashboard_has_the_panels_the_brief_asks_for() -> None:
    board = dashboard()
    exprs = "\n".join(queries(board))
    for needle in (
        "sandfleet_sandbox_startup_seconds_bucket",  # spin-up latency by phase
        "sandfleet_sandboxes{",  # pool sizes by region and state
        "sandfleet_lease_wait_seconds_bucket",
        'result="warm_hit"',  # warm hit rate
        "sandfleet_loop_phase_seconds_sum",  # the loop's split
        "sandfleet_policy_staleness_versions_bucket",
    ):
        assert needle in exprs, needle
    assert "by (le, phase)" in exprs
    assert "by (region, state)" in exprs
    assert len({p["gridPos"]["y"] * 100 + p["gridPos"]["x"] for p in board["panels"]}) == len(board["panels"])


# The gateway's series that carry `cluster` (every operator series does: controller.metrics.ClusterLabelled).
GATEWAY_CLUSTER_METRICS = {
    "sandfleet_lease_wait_seconds",
    "sandfleet_lease_acquisitions_total",
    "sandfleet_exec_seconds",
    "sandfleet_gateway_member_up",
}


def test_dashboard_filters_every_series_with_a_cluster_label_by_the_cluster_variable() -> None:
    board = dashboard()
    variables = [v["name"] for v in board["templating"]["list"] if v["type"] == "query"]
    assert variables[0] == "cluster", "the cluster variable comes first: the pools are chosen within it"
    operator = {
        next(iter(m.describe())).name
        for m in vars(operator_metrics).values()
        if isinstance(m, MetricWrapperBase)
    }
    labelled = GATEWAY_CLUSTER_METRICS | operator
    unfiltered = []
    for expr in queries(board):
        if expr == "label_values(sandfleet_sandboxes, cluster)":
            continue  # the variable itself
        for name, selector in re.findall(r"\b(sandfleet_[a-z_]+)(\{[^}]*\})?", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if (base in labelled or name in labelled) and 'cluster=~"$cluster"' not in selector:
                unfiltered.append(f"{name}{selector} in {expr}")
    assert not unfiltered, "series not filtered by $cluster:\n" + "\n".join(unfiltered)
    clusters = dashboard_panels(board, "Clusters")
    assert len(clusters) == 4
    split = [t["expr"] for p in clusters for t in p["targets"] if "member_up" not in t["expr"]]
    assert split
    assert all(re.search(r"by \([^)]*\bcluster\b", expr) for expr in split), split


def dashboard_panels(board: dict[str, Any], row: str) -> list[dict[str, Any]]:
    """The panels under `row` (an expanded row's: those after it, up to the next row)."""
    found, current = [], None
    for panel in board["panels"]:
        if panel["type"] == "row":
            current = panel["title"]
        elif current == row:
            found.append(panel)
    return found


def test_dashboard_ships_in_a_configmap_for_the_grafana_sidecar() -> None:
    (config_map,) = objects(render(), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["sandfleet.json"]) == dashboard()
    assert not objects(render("--set", "metrics.dashboard.enabled=false"), "ConfigMap")


def test_enabling_rl_alone_gives_the_actors_a_pool_of_the_task_image() -> None:
    docs = render("--set", "rl.enabled=true")
    tasks = named(docs, "SandboxPool", "rl-tasks")
    assert tasks["spec"]["template"]["image"] == "sandfleet/tasks-ci:0.1.0"
    assert tasks["spec"]["replicas"] > 0
    for role in ("actor", "learner"):
        deployment = named(docs, "Deployment", f"sandfleet-{role}")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["SANDFLEET_POOL"] == "rl-tasks", role
    (rule,) = named(docs, "Role", "sandfleet-pool-user")["rules"]
    assert "rl-tasks" in rule["resourceNames"]
    # Off, the chart adds no pool of its own.
    assert [p["metadata"]["name"] for p in objects(render(), "SandboxPool")] == ["python"]


def test_a_second_pool_of_the_same_name_is_refused_with_the_way_out() -> None:
    twice = ("--set", "rl.enabled=true", "--set", "pools[0].name=rl-tasks")
    result = helm("template", "sandfleet", str(CHART), *twice, "--set", "pools[0].regions[0].name=us-east1")
    assert result.returncode != 0
    assert 'two pools are named "rl-tasks"' in result.stderr
    assert 'rl.tasksPool.image to ""' in result.stderr


def test_your_own_rollout_worker_replaces_the_actor_image_and_command() -> None:
    docs = render("--set", "rl.enabled=true", "--set", "rl.actor.image=registry.example.com/worker:3",
                  "--set", "rl.actor.command={python3,-m,worker}")  # fmt: skip
    (actor,) = named(docs, "Deployment", "sandfleet-actor")["spec"]["template"]["spec"]["containers"]
    assert (actor["image"], actor["command"]) == (
        "registry.example.com/worker:3",
        ["python3", "-m", "worker"],
    )
    env = {e["name"] for e in actor["env"]}
    assert {
        "SANDFLEET_URL",
        "SANDFLEET_TOKEN_FILE",
        "SANDFLEET_RUN",
        "SANDFLEET_POOL",
        "SANDFLEET_LEARNER_URL",
    } <= env
    (learner,) = named(docs, "Deployment", "sandfleet-learner")["spec"]["template"]["spec"]["containers"]
    assert learner["image"] == f"localhost/sandfleet/sandfleet:{VERSION}"  # unchanged: the product image


def test_the_gateway_writes_policy_admits_every_lease_key_the_gateway_writes() -> None:
    # A label the gateway's patches write and the policy does not admit makes the apiserver refuse
    # every claim through the chart's gateway: each lease-key label must be admitted.
    (policy,) = [
        p
        for p in objects(render(), "ValidatingAdmissionPolicy")
        if p["metadata"]["name"].endswith("-gateway-writes")
    ]
    (variable,) = [v for v in policy["spec"]["variables"] if v["name"] == "leaseKeys"]
    admitted = set(json.loads(variable["expression"]))
    lease = LeaseRecord("ns.p", "python", "actor", 1.0, 61.0, 60, labels={"run": "r"}, idempotency_key="k")
    written: set[str] = set()
    patches = (
        lease_metadata(lease),
        release_metadata(),
        unclaim_metadata(),
        reserve_metadata("a", "r", 1, 2.0),
    )
    for patch in patches:
        for part in ("labels", "annotations"):
            written |= set(patch.get(part, {}))
    assert written == admitted
