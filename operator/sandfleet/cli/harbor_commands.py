"""`sandfleet harbor build`: a Harbor task's environment/Dockerfile built daemonless into an OCI archive.

The thin edge of `sandfleet.adapters.harbor_dockerfile`: it probes the registries a FROM names,
runs Debian's buildah (no daemon, its own vfs storage in a temporary directory, RUN steps with no
network) and prints the archive's reference, which `serve --local --image` takes as it is.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from sandfleet.cli.app import app

harbor = typer.Typer(help="Harbor tasks: build a task's environment into an image `serve --local` takes.",
                     no_args_is_help=True)  # fmt: skip
app.add_typer(harbor, name="harbor")

BUILD_TIMEOUT_S = 1800


def _reachable(registry: str, timeout_s: float) -> bool:
    from sandfleet.adapters.harbor_dockerfile import registry_host

    try:
        with socket.create_connection(registry_host(registry), timeout=timeout_s):
            return True
    except OSError:
        return False


@harbor.command("build")
def build(
    task_dir: Annotated[Path, typer.Argument(help="The Harbor task: its environment/Dockerfile is built.")],
    out: Annotated[
        Path | None, typer.Option(help="The OCI archive to write (default: TASK_DIR's name + .oci.tar).")
    ] = None,
    base: Annotated[
        str | None,
        typer.Option(
            envvar="SANDFLEET_HARBOR_BASE",
            help="The local image a FROM whose registry cannot be reached is rewritten to "
            "(oci-archive:PATH, or any reference buildah takes).",
        ),
    ] = None,
    probe_timeout: Annotated[float, typer.Option(help="Seconds to wait for a registry to answer.")] = 3.0,
    offline: Annotated[
        bool, typer.Option(help="Use no registry: rewrite every FROM that names one to --base, unprobed.")
    ] = False,
    registry_auth_file: Annotated[
        Path | None,
        typer.Option(
            envvar="SANDFLEET_REGISTRY_AUTH_FILE", help="A containers-auth.json for the base's registry."
        ),
    ] = None,
    registry_cert_dir: Annotated[
        Path | None, typer.Option(help="A directory holding the base registry's CA as ca.crt.")
    ] = None,
    buildah: Annotated[str, typer.Option(help="The buildah program.")] = "buildah",
) -> None:
    """Build TASK_DIR/environment/Dockerfile; print {"image": "oci-archive:OUT", ...} for `serve --image`."""
    from sandfleet.adapters.harbor_dockerfile import (
        DockerfileError,
        build_error,
        buildah_argv,
        rewrite_from,
        steps,
    )

    context = task_dir / "environment"
    try:
        text = (context / "Dockerfile").read_text()
    except OSError as error:
        typer.echo(f"harbor build: cannot read {context / 'Dockerfile'}: {error.strerror}", err=True)
        raise typer.Exit(2) from None
    if shutil.which(buildah) is None:
        typer.echo(f"harbor build: {buildah} is not installed (Debian: apt-get install -y buildah)", err=True)
        raise typer.Exit(2)
    try:
        rewrite = rewrite_from(
            text, base, lambda registry: _reachable(registry, probe_timeout), offline=offline
        )
    except DockerfileError as error:
        typer.echo(f"harbor build: {error}", err=True)
        raise typer.Exit(2) from None
    for note in rewrite.notes:
        typer.echo(f"harbor build: {note}", err=True)
    target = (out or Path(f"{task_dir.resolve().name}.oci.tar")).resolve()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sandfleet-buildah-") as scratch:
        dockerfile = Path(scratch) / "Dockerfile"
        dockerfile.write_text(rewrite.text)
        storage = Path(scratch) / "storage"
        argv = buildah_argv(dockerfile, context, f"oci-archive:{target}", storage, buildah=buildah,
                            auth_file=registry_auth_file, cert_dir=registry_cert_dir)  # fmt: skip
        try:
            # Merged output: the error names the failing step after the step's own lines.
            done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=BUILD_TIMEOUT_S, check=False)  # fmt: skip
        except subprocess.TimeoutExpired:
            typer.echo(f"harbor build: buildah ran past {BUILD_TIMEOUT_S} s and was stopped", err=True)
            raise typer.Exit(1) from None
    if done.returncode != 0:
        typer.echo(f"harbor build: {build_error(done.stdout, steps(rewrite.text))}", err=True)
        raise typer.Exit(1)
    seconds = round(time.monotonic() - started, 1)
    typer.echo(json.dumps({"image": f"oci-archive:{target}", "seconds": seconds, "notes": rewrite.notes}))
