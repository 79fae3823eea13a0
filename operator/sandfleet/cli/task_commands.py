"""`sandfleet task`: build, mine and check tasks (the group; its commands live in their own modules)."""

# Created by T4 (task factory) with just the group, for T2 (`task build`) to fill in: add `build`
# here; `mine` and `check` register themselves from cli/task_factory_commands.py.

from __future__ import annotations

import typer

from sandfleet.cli import app

task = typer.Typer(help="Tasks: build their images, mine them from packages, check them in gVisor.",
                   no_args_is_help=True)  # fmt: skip
app.add_typer(task, name="task")
