"""`sandfleet operator`: run the kopf operator that keeps SandboxPools filled."""

from __future__ import annotations

import typer

from sandfleet.cli import app


@app.command()
def operator(
    namespace: list[str] = typer.Option(  # noqa: B008
        [], "--namespace", "-n", help="Namespaces to watch (repeatable); all when omitted."
    ),
) -> None:
    """Run the operator (kubeconfig or in-cluster config)."""
    from sandfleet.controller.main import run

    run(namespaces=namespace)
