"""`sandfleet operator`: run the kopf operator that keeps SandboxPools filled."""

from __future__ import annotations

import typer

from sandfleet.cli import app


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
) -> None:
    """Run the operator (kubeconfig or in-cluster config)."""
    from sandfleet.controller.main import run

    run(
        namespaces=namespace,
        metrics_port=metrics_port,
        lease_seconds=leader_lease_seconds,
        liveness_endpoint=liveness,
    )
