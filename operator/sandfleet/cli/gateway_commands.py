"""`sandfleet gateway`: serve leases from the Kubernetes runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sandfleet.cli import app


@app.command()
def gateway(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    namespace: Annotated[
        str, typer.Option("--namespace", "-n", help="Namespace whose pools to serve.")
    ] = "default",
    auth: Annotated[
        str, typer.Option(help="kubernetes (TokenReview + RBAC), static (token file) or none.")
    ] = "kubernetes",
    token_file: Annotated[
        Path | None, typer.Option(help="Static tokens, lines `TOKEN NAME [POOLS]`.")
    ] = None,
    max_waiting: Annotated[int, typer.Option(help="Callers that may queue per pool.")] = 1000,
) -> None:
    """Serve the Kubernetes runtime's pools (kubeconfig or in-cluster config)."""
    from pydantic import ValidationError

    from sandfleet.gateway.main import run
    from sandfleet.gateway.settings import GatewaySettings

    try:
        settings = GatewaySettings(
            host=host,
            port=port,
            namespace=namespace,
            auth=auth,
            token_file=token_file,
            max_waiting=max_waiting,
        )
    except ValidationError as error:
        first = error.errors()[0]
        raise typer.BadParameter(f"{first['loc'][0]}: {first['msg']}") from None
    run(settings)
