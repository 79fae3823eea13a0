"""The one typer app every command module adds its commands to; `sandfleet.cli` registers them all.

It lives apart from the package's `__init__` so that the command modules import it without
importing the package that imports them (no cycle).
"""

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
