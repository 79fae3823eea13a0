"""`sandfleet operator`: run the kopf operator that keeps SandboxPools filled."""

from __future__ import annotations

from pathlib import Path

import typer

from sandfleet.cli.app import app


@app.command()
def operator(
    namespace: list[str] = typer.Option(  # noqa: B008
        [], "--namespace", "-n", help="Namespaces to watch (repeatable); all when omitted."
    ),
    metrics_port: int = typer.Option(
        8080,
        "--metrics-port",
        envvar="SANDFLEET_METRICS_PORT",
        help="Prometheus /metrics port; 0 turns it off.",
    ),
    leader_lease_seconds: float = typer.Option(
        15.0,
        "--leader-lease-seconds",
        envvar="SANDFLEET_LEADER_LEASE_SECONDS",
        help="How long a silent leader keeps the lease before another replica takes over.",
    ),
    liveness: str | None = typer.Option(
        None, "--liveness", help="kopf liveness endpoint, e.g. http://0.0.0.0:8081/healthz."
    ),
    agent_key_file: Path | None = typer.Option(  # noqa: B008
        None,
        "--agent-key-file",
        envvar="SANDFLEET_OPERATOR_AGENT_KEY_FILE",
        help="The fleet key (hex) each sandbox agent's token derives from; the gateway holds the same.",
    ),
    runtime_class: list[str] = typer.Option(  # noqa: B008
        ["gvisor"],
        "--runtime-class",
        envvar="SANDFLEET_OPERATOR_RUNTIME_CLASSES",
        help="A RuntimeClass pools may name (repeatable); a pool naming another gets no sandboxes.",
    ),
    cluster: str = typer.Option(
        "default",
        "--cluster",
        envvar="SANDFLEET_CLUSTER",
        help="The name of this cluster, the `cluster` label of every metric (in a fleet, the name the "
        "fleet gateway's --member gives it).",
    ),
) -> None:
    """Run the operator (kubeconfig or in-cluster config)."""
    from sandfleet.controller.main import OperatorConfigError, read_agent_key, run
    from sandfleet.kube.errors import KubeConfigError

    try:
        key = read_agent_key(agent_key_file)
    except OperatorConfigError as error:
        typer.echo(f"sandfleet operator: {error}", err=True)
        raise typer.Exit(2) from None
    try:
        run(
            namespaces=namespace,
            metrics_port=metrics_port,
            lease_seconds=leader_lease_seconds,
            liveness_endpoint=liveness,
            agent_key=key,
            runtime_classes=[c for value in runtime_class for c in value.split(",") if c],
            cluster=cluster,
        )
    except KubeConfigError as error:
        typer.echo(f"sandfleet operator: {error}", err=True)
        raise typer.Exit(2) from None
