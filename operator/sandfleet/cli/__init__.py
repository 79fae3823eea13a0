"""The `sandfleet` command line: one typer app; each command group lives in its own module."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="sandfleet",
    help="gVisor-isolated coding sandboxes for agentic RL: serve, lease, exec, operate.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def version() -> None:
    """Print sandfleet's version."""
    from sandfleet import __version__

    typer.echo(__version__)


def _register_commands() -> None:
    # Importing a command module adds its commands to `app`; each imports its heavy deps lazily.
    from sandfleet.cli import (  # noqa: F401
        client_commands,
        gateway_commands,
        operator_commands,
        rl_commands,
        run_commands,
        serve_commands,
        task_commands,
        task_factory_commands,
    )


_register_commands()
