"""`sandfleet serve --local`: the embedded default, a gateway over gVisor sandboxes on this host."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sandfleet.cli.app import app

GRACEFUL_SHUTDOWN_SECONDS = 5


@app.command()
def serve(
    local: Annotated[
        bool, typer.Option("--local", help="Local gVisor sandboxes (the only runtime serve has).")
    ] = True,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    pool: Annotated[str, typer.Option(help="Name of the local pool.")] = "default",
    warm: Annotated[int, typer.Option(min=0, max=64, help="Sandboxes kept warm.")] = 2,
    token_file: Annotated[
        Path | None,
        typer.Option(help="Static tokens, lines `TOKEN NAME [POOLS]`; none means no auth."),
    ] = None,
    tasks: Annotated[
        bool,
        typer.Option(
            "--tasks",
            help="Serve the default task catalogue's image (tasks/ci.yaml, as `rl run` samples it) first.",
        ),
    ] = False,
    policy_file: Annotated[
        Path | None,
        typer.Option(help="Where runs' policy versions persist (default ~/.cache/sandfleet/policies.json)."),
    ] = None,
    image: Annotated[
        list[str] | None,
        typer.Option(
            "--image",
            help="An image to serve: `LAYOUT:TAG` (an OCI layout, as `sandbox_image/build task` prints), "
            "a registry's `docker://HOST[:PORT]/NAME:TAG` (or `HOST[:PORT]/NAME:TAG`), "
            "`oci-archive:PATH[:TAG]`, `docker-archive:PATH` (`docker save` output) or `base`; repeat for "
            "several. Pulled images land in ~/.cache/sandfleet/image-store, pinned by digest at start. "
            "Leases name an image by its tag (a layout's) or the reference as given (less `docker://`); "
            "the first is the pool's own. Default: the base image.",
        ),
    ] = None,
    registry_auth_file: Annotated[
        Path | None,
        typer.Option(
            envvar=["SANDFLEET_REGISTRY_AUTH_FILE", "REGISTRY_AUTH_FILE"],
            help="Registry credentials, containers-auth.json as `skopeo login --authfile` writes it.",
        ),
    ] = None,
    registry_cert_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="SANDFLEET_REGISTRY_CERT_DIR",
            help="A directory of CA certificates (`*.crt`) to trust for registries (skopeo --src-cert-dir).",
        ),
    ] = None,
    recycle_episodes: Annotated[
        int,
        typer.Option(
            min=0,
            help="Recycle sandboxes in place: one serves up to this many episodes of the same run "
            "(lease label `run`), reset between them from a golden gVisor checkpoint and probed clean. "
            "0 (the default): every sandbox serves one episode.",
        ),
    ] = 0,
    recycle_seconds: Annotated[
        float,
        typer.Option(min=1.0, help="With --recycle-episodes: a sandbox older than this is not reused."),
    ] = 3600.0,
    clean_scoring: Annotated[
        bool,
        typer.Option(
            help="Score every task evaluate in a clean sandbox of the same image that the episode's tree "
            "is copied into, never in the episode's own (costs a warm sandbox per evaluate; a caller "
            "may also ask per call with ?clean=true)."
        ),
    ] = False,
    commands_as_image_user: Annotated[
        bool,
        typer.Option(
            help="Run the episodes' commands as each image's own User (root when it names none, as task "
            "images expect) instead of the agent's unprivileged user. Such commands can reach the agent, "
            "so every task evaluate is scored in a clean sandbox (implies --clean-scoring), a sandbox "
            "lost mid-episode scores 0, and a test-command evaluate is refused.",
        ),
    ] = False,
) -> None:
    """Serve leases on local gVisor sandboxes (root, no cluster): same API as `sandfleet gateway`."""
    import asyncio

    import uvicorn
    from rich.console import Console
    from rich.markup import escape

    from sandfleet.cli.settings_flags import load_settings
    from sandfleet.core.recycle import RecyclePolicy
    from sandfleet.gateway.app import Runtime, create_app
    from sandfleet.gateway.auth import Authenticator, parse_token_file
    from sandfleet.gateway.local import MAX_SANDBOXES, LocalBackend
    from sandfleet.gateway.runs import MemoryPolicyStore
    from sandfleet.gateway.serving import guarded_protocol
    from sandfleet.gateway.settings import (
        KEEP_ALIVE_SECONDS,
        CapacitySettings,
        LocalImageSettings,
        TenantSettings,
    )
    from sandfleet.local.artifacts import ImageRef, ensure_base_image, ensure_runsc
    from sandfleet.local.errors import LocalRuntimeError
    from sandfleet.local.image import ensure_rootfs, read_image_config
    from sandfleet.local.pull import RegistryAccess, resolve_image
    from sandfleet.local.runtime import LocalRuntime, image_user

    console = Console(stderr=True)
    # SANDFLEET_GATEWAY_* only (no flags here), read before anything is built: a bad one is one line.
    capacity = load_settings(CapacitySettings, {})  # SANDFLEET_GATEWAY_MAX_LEASES_PER_TENANT and friends
    tenancy = load_settings(TenantSettings, {})  # SANDFLEET_GATEWAY_RUN_ADMINS, body caps, timeouts
    image_limits = load_settings(LocalImageSettings, {}).limits()  # SANDFLEET_LOCAL_MAX_IMAGE_BYTES...
    if not local:
        raise typer.BadParameter("serve has only the local runtime; use `sandfleet gateway` for Kubernetes")
    if token_file is None and host not in ("127.0.0.1", "localhost", "::1"):
        raise typer.BadParameter("without --token-file, serve only listens on loopback")
    names = list(image or [])
    recycle = None
    if recycle_episodes:
        try:
            recycle = RecyclePolicy(max_episodes=recycle_episodes, max_seconds=recycle_seconds)
        except ValueError as error:
            raise typer.BadParameter(str(error), param_hint="--recycle-episodes") from None
    if commands_as_image_user and recycle_episodes:
        raise typer.BadParameter(
            "a sandbox whose commands ran as the image's user (root) cannot be reset for another "
            "episode: drop --recycle-episodes or --commands-as-image-user",
            param_hint="--recycle-episodes",
        )
    if warm * max(len(names) + tasks, 1) > MAX_SANDBOXES:
        raise typer.BadParameter(
            f"--warm {warm} of each image exceeds the {MAX_SANDBOXES} sandboxes serve holds"
        )
    try:
        with console.status("building (or finding) runsc and the sandbox image..."):
            runsc = asyncio.run(ensure_runsc())
            base = asyncio.run(ensure_base_image())
        access = RegistryAccess(auth_file=registry_auth_file, cert_dir=registry_cert_dir)
        with console.status("finding (or pulling) the images..."):
            images = [base if name == "base" else asyncio.run(resolve_image(name, access)) for name in names]
        if tasks:
            from sandfleet.rl.catalogue_tasks import DEFAULT_CATALOGUE, build_image, image_name, load_tasks
            from sandfleet.tasks.fetching import TaskBuildError

            with console.status("fetching the tasks from PyPI (cached) and building their image..."):
                try:
                    built = build_image(load_tasks(), image_name(DEFAULT_CATALOGUE))
                except TaskBuildError as error:
                    raise LocalRuntimeError(str(error)) from None
            images.insert(0, ImageRef(Path(built["layout"]), built["tag"], built["digest"]))
        images = images or [base]
        # Each image's layers are checked and unpacked here, once per digest, so a bad one is this
        # one line and no server starts (the runtime would find it at its first boot instead).
        with console.status("checking and unpacking the images (once per digest)..."):
            for served_image in images:
                rootfs = asyncio.run(ensure_rootfs(served_image, image_limits))
                if commands_as_image_user:  # its User must be one its /etc/passwd names
                    image_user(served_image, read_image_config(served_image), rootfs)
        # A fresh fleet key: only this process reaches agents.
        sandboxes = LocalRuntime(
            images[0], runsc, commands_as_image_user=commands_as_image_user, image_limits=image_limits
        )
        backend = LocalBackend(
            sandboxes,
            pool,
            images,
            warm,
            recycle=recycle,
            clean_scoring=clean_scoring,
            commands_as_image_user=commands_as_image_user,
        )
    except LocalRuntimeError as error:
        # One unwrapped line, the message as it is (no markup read in it): what was wrong, what to do.
        console.print(f"[red]error:[/red] {escape(str(error))}", soft_wrap=True)
        raise typer.Exit(1) from None
    authenticator = Authenticator(
        static_tokens=parse_token_file(token_file.read_text()) if token_file else {},
        anonymous_allowed=token_file is None,
    )
    runtime = Runtime(
        backend=backend,
        authenticator=authenticator,
        ready=backend.ready,
        start=backend.start,
        stop=backend.stop,
        agent_key=sandboxes.fleet_key,
        policy_store=MemoryPolicyStore(policy_file or Path.home() / ".cache/sandfleet/policies.json"),
        capacity=capacity,
        tenancy=tenancy,
        # sandfleet_sandbox_startup_seconds, as the operator exports it; resets of a recycling pool
        collectors=backend.collectors,
        freeze_heap=True,
    )
    served = ", ".join(f"{i.tag} ({i.digest[:19]})" for i in images)
    reuse = f", recycled up to {recycle_episodes} episodes per run" if recycle else ""
    console.print(
        f"sandfleet: serving pool {pool!r} ({warm} warm of each of {served}{reuse}) on http://{host}:{port}"
    )
    uvicorn.run(
        create_app(runtime),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        http=guarded_protocol(tenancy),  # header timeout, connections per client address
        # On SIGTERM or SIGINT, requests still running after this are cancelled, so the sandboxes
        # are always torn down (a long exec must not keep the server, or its sandboxes, alive).
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
