"""`sandfleet operator`: run the kopf operator that keeps SandboxPools filled."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from sandfleet import __version__
from sandfleet.cli.app import app

# Each OperatorSettings field's flag (controller/settings.py): the settings hold the defaults and
# the variables, these options only what is typed on the command line.
FLAGS = {
    "namespaces": "--namespace",
    "metrics_port": "--metrics-port",
    "leader_lease_seconds": "--leader-lease-seconds",
    "leader_namespace": "--leader-namespace",
    "liveness": "--liveness",
    "agent_key_file": "--agent-key-file",
    "runtime_classes": "--runtime-class",
    "cluster": "--cluster",
    "log_level": "--log-level",
    "ledger_shards": "--ledger-shards",
    "agent_bundle_image": "--agent-bundle-image",
    "agent_bundle_pull_policy": "--agent-bundle-pull-policy",
}


@app.command()
def operator(
    namespace: Annotated[
        list[str] | None,
        typer.Option(
            "--namespace", "-n", help="Namespace to watch (repeatable).", show_default="every namespace"
        ),
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Prometheus /metrics port; 0 turns it off.", show_default="8080")
    ] = None,
    leader_lease_seconds: Annotated[
        float | None,
        typer.Option(
            help="How long a silent leader keeps the lease before another replica takes over.",
            show_default="15",
        ),
    ] = None,
    leader_namespace: Annotated[
        str | None,
        typer.Option(
            help="Namespace of the leader Lease.",
            show_default="$POD_NAMESPACE, else the first --namespace, else default",
        ),
    ] = None,
    liveness: Annotated[
        str | None, typer.Option(help="kopf liveness endpoint, e.g. http://0.0.0.0:8081/healthz.")
    ] = None,
    agent_key_file: Annotated[
        Path | None,
        typer.Option(
            help="The fleet key (hex) each sandbox agent's token derives from; the gateway holds the "
            "same (required)."
        ),
    ] = None,
    runtime_class: Annotated[
        list[str] | None,
        typer.Option(
            help="A RuntimeClass pools may name (repeatable, or comma-separated); a pool naming another "
            "gets no sandboxes.",
            show_default="gvisor",
        ),
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option(
            help="The name of this cluster, the `cluster` label of every metric (in a fleet, the name the "
            "fleet gateway's --member gives it).",
            show_default="default",
        ),
    ] = None,
    log_level: Annotated[
        str | None, typer.Option(help="DEBUG, INFO, WARNING, ERROR or CRITICAL.", show_default="INFO")
    ] = None,
    ledger_shards: Annotated[
        int | None,
        typer.Option(
            help="Ledger shards new Pods of `ledger` pools spread over, per namespace.",
            show_default="24",
        ),
    ] = None,
    agent_bundle_image: Annotated[
        str | None,
        typer.Option(
            help="The agent bundle image injected into the sandboxes of pools with "
            "`spec.template.agent: injected`.",
            show_default=f"localhost/sandfleet/agent-bundle:{__version__}",
        ),
    ] = None,
    agent_bundle_pull_policy: Annotated[
        str | None,
        typer.Option(help="The agent bundle image's imagePullPolicy.", show_default="IfNotPresent"),
    ] = None,
) -> None:
    """Run the operator (kubeconfig or in-cluster config).

    Every option can also come from the environment (controller/settings.py): SANDFLEET_NAMESPACES,
    SANDFLEET_METRICS_PORT, SANDFLEET_LEADER_LEASE_SECONDS, SANDFLEET_LEADER_NAMESPACE (else
    POD_NAMESPACE), SANDFLEET_LIVENESS, SANDFLEET_OPERATOR_AGENT_KEY_FILE,
    SANDFLEET_OPERATOR_RUNTIME_CLASSES, SANDFLEET_CLUSTER, SANDFLEET_LOG_LEVEL, SANDFLEET_LEDGER_SHARDS,
    SANDFLEET_AGENT_BUNDLE_IMAGE, SANDFLEET_AGENT_BUNDLE_PULL_POLICY (lists comma-separated); a flag
    given on the command line wins over the environment.
    """
    from sandfleet.cli.settings_flags import load_settings
    from sandfleet.controller.main import OperatorConfigError, run
    from sandfleet.controller.settings import OperatorSettings
    from sandfleet.kube.errors import KubeConfigError

    given: dict[str, Any] = {
        "namespaces": namespace or None,
        "metrics_port": metrics_port,
        "leader_lease_seconds": leader_lease_seconds,
        "leader_namespace": leader_namespace,
        "liveness": liveness,
        "agent_key_file": agent_key_file,
        "runtime_classes": runtime_class or None,
        "cluster": cluster,
        "log_level": log_level,
        "ledger_shards": ledger_shards,
        "agent_bundle_image": agent_bundle_image,
        "agent_bundle_pull_policy": agent_bundle_pull_policy,
    }
    settings = load_settings(OperatorSettings, given, FLAGS)
    try:
        run(settings)
    except (OperatorConfigError, KubeConfigError) as error:
        typer.echo(f"sandfleet operator: {error}", err=True)
        raise typer.Exit(2) from None
