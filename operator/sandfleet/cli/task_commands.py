"""`sandfleet task`: the group, and `task build`; `mine` and `check` are in cli/task_factory_commands.py.

The group lives here and the factory's commands register themselves on it from their own module,
which imports this one (this one never imports it, so there is no cycle).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from sandfleet.cli.app import app

task = typer.Typer(help="Tasks: build their images, mine them from packages, check them in gVisor.",
                   no_args_is_help=True)  # fmt: skip
app.add_typer(task, name="task")

SANDBOX_IMAGE = Path(__file__).resolve().parents[3] / "sandbox_image"


def task_builder_on_path() -> None:
    """Make sandbox_image/'s builders importable (`import task_image`): the one image implementation.

    They live beside the agent, outside the package, because `sandbox_image/build` runs them with the
    host's python3 before anything is installed.
    """
    if str(SANDBOX_IMAGE) not in sys.path:
        sys.path.insert(0, str(SANDBOX_IMAGE))


@task.command("build")
def build(
    name: Annotated[str, typer.Argument(help="Task name; the image tag becomes task-<name>.")],
    workspace: Annotated[
        Path | None, typer.Option("--workspace", "--dir", help="A directory, copied to /workspace as it is.")
    ] = None,
    git: Annotated[Path | None, typer.Option(help="A local git checkout, exported at --rev.")] = None,
    rev: Annotated[str | None, typer.Option(help="Commit, branch or tag of --git (default HEAD).")] = None,
    sdist: Annotated[
        str | None, typer.Option(help="A PyPI source distribution, pinned: NAME==VERSION.")
    ] = None,
    setup: Annotated[
        str | None, typer.Option(help="Shell command run in /workspace as the sandbox user.")
    ] = None,
    test_deps: Annotated[
        list[str] | None, typer.Option("--test-deps", help="More test requirements (repeatable).")
    ] = None,
    install: Annotated[
        bool | None,
        typer.Option(
            "--install/--no-install",
            help="pip install -e . with its test extras, and pytest (default: on for --sdist only).",
        ),
    ] = None,
    wheels: Annotated[
        Path | None, typer.Option(help="Install from this directory only; the set-up has no network.")
    ] = None,
    mirror: Annotated[
        str, typer.Option(envvar="SANDFLEET_DEBIAN_MIRROR", help="Debian mirror for the base image.")
    ] = "http://deb.debian.org/debian",
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as one JSON line.")] = False,
) -> None:
    """Build a task image (base + source + hermetic set-up); prints its digest. Needs root."""
    task_builder_on_path()
    import image_builder
    import task_image

    if os.geteuid() != 0:
        typer.echo("task build: building images needs root (chroot, umoci unpack)", err=True)
        raise typer.Exit(2)
    try:
        source = task_image.source_from_args(workspace, git, rev, sdist)
        image = task_image.build_task_image(
            name,
            source,
            setup=setup,
            test_deps=test_deps or (),
            wheels=wheels.resolve() if wheels else None,
            install=install,
            mirror=mirror,
        )
    except image_builder.BuildError as error:
        typer.echo(f"task build: {error}", err=True)
        raise typer.Exit(1) from None
    image_builder.progress(f"digest {image.digest} ({image.layout}:{image.tag})")
    if image.log is not None:
        image_builder.progress(f"set-up log: {image.log}")
    typer.echo(json.dumps(image.to_json()) if as_json else image.digest)
