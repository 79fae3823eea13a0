"""The `sandfleet` command line: the typer app (`cli/app.py`) with every command group registered."""

from __future__ import annotations

from sandfleet.cli.app import app


def _register_commands() -> None:
    # Importing a command module adds its commands to `app`; each imports its heavy deps lazily.
    from sandfleet.cli import (  # noqa: F401
        client_commands,
        gateway_commands,
        harbor_commands,
        operator_commands,
        rl_commands,
        run_commands,
        serve_commands,
        task_commands,
        task_factory_commands,
        task_format_commands,
    )


_register_commands()

__all__ = ["app"]
