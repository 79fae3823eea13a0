"""Entry point: `python3 -m sandfleet_agent --port 8000 --root /workspace`."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from sandfleet_agent import image_config, image_files, probe, programs, reaper, reset
from sandfleet_agent.evaluate import (
    HARBOR_SOLUTION_DIR,
    HARBOR_TESTS_DIR,
    default_logs_dir,
    prepare_episode_logs,
)
from sandfleet_agent.server import DEFAULT_PATH, AgentConfig, AgentServer
from sandfleet_agent.users import Identity, parse_identity

RESET_ROOTS = ("/tmp", "/var/tmp", "/home", "/root", "/dev/shm")
# `--root auto`, `--exec-user auto`, `--image-env auto`: learn it from the image, inside the sandbox.
AUTO = "auto"
# `--exec-user image:USER`: commands run as the image's own user (root for most task images).
IMAGE_USER = "image:"
EXEC_HOME = "/home/sandbox"
VERIFIER_HOME = "/home/verifier"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Read the command line."""
    parser = argparse.ArgumentParser(prog="sandfleet-agent", description=__doc__)
    parser.add_argument("--host", default=os.environ.get("SANDFLEET_AGENT_HOST", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("SANDFLEET_AGENT_PORT", "8000")))
    parser.add_argument(
        "--root",
        default=os.environ.get("SANDFLEET_AGENT_ROOT", "/workspace"),
        help="the working area; 'auto': the directory the agent starts in (the image's WorkingDir), "
        "/workspace when that is /",
    )
    parser.add_argument("--logs-dir", default=str(default_logs_dir()))
    parser.add_argument(
        "--token-file",
        default=os.environ.get("SANDFLEET_AGENT_TOKEN_FILE"),
        help="file holding the bearer token every route except health and ready requires "
        "(or set SANDFLEET_AGENT_TOKEN)",
    )
    parser.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="serve without a token: anyone who reaches the port may run commands (tests only)",
    )
    parser.add_argument(
        "--exec-user",
        default=os.environ.get("SANDFLEET_AGENT_EXEC_USER", "none"),
        help="UID:GID[:HOME] every exec and job runs as (HOME /home/sandbox; the image passes 1000:1000), "
        "'auto' (with --verifier-user auto) for the first two ids from 1000000 the image's "
        "/etc/passwd and /etc/group do not name, 'image:USER' for the image's own user as its "
        "/etc/passwd resolves it, 'root' for root (then this sandbox never scores its own episode), "
        "or 'none' (the default) for the agent's own",
    )
    parser.add_argument(
        "--verifier-user",
        default=os.environ.get("SANDFLEET_AGENT_VERIFIER_USER", "none"),
        help="UID:GID evaluate runs the tests as (HOME /home/verifier; the image passes 1001:1001), "
        "'auto' (with --exec-user auto or image:USER), or 'none' (the default) for the agent's own",
    )
    parser.add_argument(
        "--extra-root",
        action="append",
        default=None,
        help="an absolute directory besides --root that the files routes reach, root's and never the "
        "commands' user's (repeat; default: Harbor's /tests and /solution, and --logs-dir)",
    )
    parser.add_argument(
        "--pristine-dir",
        default=os.environ.get("SANDFLEET_AGENT_PRISTINE_DIR"),
        help="copy the writable roots here (root only) at start, so POST /v1/reset can put them back "
        "(for runtimes without checkpoint and restore); default: no reset",
    )
    parser.add_argument(
        "--bundle",
        default=os.environ.get("SANDFLEET_AGENT_BUNDLE"),
        help="where the agent bundle is mounted (the agent runs from it, in an image sandfleet did not "
        "build): its git and setpriv are used, the image's environment comes from "
        "--image-env, and --root and the users' homes are made",
    )
    parser.add_argument(
        "--image-env",
        default=os.environ.get("SANDFLEET_AGENT_IMAGE_ENV", "{}"),
        help="with --bundle: the image's environment, every command's, as a JSON object (default: "
        "SANDFLEET_AGENT_IMAGE_ENV), or 'auto' for the agent's own environment as the container "
        "runtime gave it (the image's Env and the pool's), without the agent's and the kubelet's "
        "variables",
    )
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    return parser.parse_args(argv)


def extra_roots(given: list[str] | None, logs_dir: Path) -> tuple[Path, ...]:
    """The extra roots asked for, else Harbor's: its tests and solution go in, its logs come out."""
    if given is None:
        return (Path(HARBOR_TESTS_DIR), Path(HARBOR_SOLUTION_DIR), logs_dir)
    return tuple(Path(root) for root in given if root)


def read_image_env(text: str) -> dict[str, str]:
    """The image's environment, passed as a JSON object of strings."""
    data = json.loads(text)
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ValueError("SANDFLEET_AGENT_IMAGE_ENV must be a JSON object of strings")
    return {str(key): value for key, value in data.items()}


def read_image_table(path: str) -> str | None:
    """A small regular file of this sandbox's image (/etc/passwd, /etc/group), as the host reads it."""
    return image_files.read_image_file("/", path)


def auto_users() -> tuple[str, str]:
    """`--exec-user` and `--verifier-user` values chosen from the ids this image does not name."""
    users = image_config.choose_agent_users(read_image_table("/etc/passwd"), read_image_table("/etc/group"))
    return f"{users.exec_id}:{users.exec_id}", f"{users.verifier_id}:{users.verifier_id}"


def image_user(user: str) -> str:
    """`--exec-user image:USER`: USER as the image's /etc/passwd and /etc/group resolve it (root by name)."""
    resolved = image_config.resolve_image_user(
        user, read_image_table("/etc/passwd"), read_image_table("/etc/group")
    )
    return resolved.exec_user()


def auto_image_env() -> dict[str, str]:
    """The image's environment from the agent's own (kubelet merged the image's Env into it).

    The launcher keeps the environment the container started with (before its shell changed it, and
    with the loader's variables moved out of the agent's way); without one, the agent's own is read.
    """
    started = os.environ.get(image_config.STARTED_ENVIRON_VARIABLE)
    items = (
        image_config.decode_started_environ(started)
        if started is not None
        else [f"{name}={value}" for name, value in os.environ.items()]
    )
    env = image_config.image_env_from_container(items)
    # From here the agent's own environment is its variables and a fixed PATH, as on the local runtime.
    own = image_config.agent_own_environment(os.environ, DEFAULT_PATH)
    os.environ.clear()
    os.environ.update(own)
    return env


def prepare_image(root: Path, exec_user: Identity | None, verifier_user: Identity | None) -> None:
    """Make what sandfleet's own image has built in: the working area (the commands' user's) and homes.

    Only the working area's directory itself is given to that user (the image's files in it stay
    as they are); the root of the filesystem never is.
    """
    root.mkdir(parents=True, exist_ok=True)
    if exec_user is not None and root.resolve() != Path("/"):
        os.chown(root, exec_user.uid, exec_user.gid)
    for user in (exec_user, verifier_user):
        if user is not None:
            home = Path(user.home)
            home.mkdir(parents=True, exist_ok=True)
            os.chown(home, user.uid, user.gid)
            os.chmod(home, 0o755)


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM or SIGINT."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if AUTO in (args.exec_user, args.verifier_user):
        chosen_here = args.exec_user == AUTO or args.exec_user.startswith(IMAGE_USER)
        if args.verifier_user != AUTO or not chosen_here:
            print(
                "sandfleet-agent: --verifier-user auto goes with --exec-user auto or image:USER (and back)",
                file=sys.stderr,
            )
            return 2
        try:
            chosen_exec, args.verifier_user = auto_users()
            if args.exec_user == AUTO:
                args.exec_user = chosen_exec
        except ValueError as error:
            print(f"sandfleet-agent: --exec-user auto: {error}", file=sys.stderr)
            return 2
    if args.exec_user.startswith(IMAGE_USER):
        try:
            args.exec_user = image_user(args.exec_user.removeprefix(IMAGE_USER))
        except ValueError as error:
            print(f"sandfleet-agent: --exec-user {args.exec_user}: the image's {error}", file=sys.stderr)
            return 2
    if args.root == AUTO:
        args.root = image_config.working_area(os.getcwd())
    root = Path(args.root)
    if image_config.system_directory(str(root.resolve())):
        print(
            f"sandfleet-agent: --root {str(root)!r} is a system directory: the working area is given to "
            "the commands' user, so it must be the task's own (the image's WorkingDir, such as /testbed)",
            file=sys.stderr,
        )
        return 2
    if not root.is_dir() and not args.bundle:
        print(f"sandfleet-agent: --root {str(root)!r} is not a directory", file=sys.stderr)
        return 2
    token = os.environ.get("SANDFLEET_AGENT_TOKEN")
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as error:
            print(f"sandfleet-agent: cannot read --token-file: {error.strerror}", file=sys.stderr)
            return 2
    if not token and not args.insecure_no_token:
        print(
            "sandfleet-agent: no bearer token: set SANDFLEET_AGENT_TOKEN or pass --token-file "
            "(every route but /v1/health and /v1/ready requires it); --insecure-no-token serves "
            "without one, for tests only",
            file=sys.stderr,
        )
        return 2
    try:
        exec_user = parse_identity(args.exec_user, EXEC_HOME)
        verifier_user = parse_identity(args.verifier_user, VERIFIER_HOME)
    except ValueError as error:
        print(f"sandfleet-agent: --exec-user/--verifier-user: {error}", file=sys.stderr)
        return 2
    if (exec_user is not None or verifier_user is not None) and os.geteuid() != 0:
        print("sandfleet-agent: --exec-user/--verifier-user need the agent to run as root", file=sys.stderr)
        return 2
    if exec_user is not None and verifier_user is not None and exec_user.uid == verifier_user.uid:
        print("sandfleet-agent: the verifier must not run as the exec user", file=sys.stderr)
        return 2
    image_env = None
    if args.bundle:
        try:
            programs.use_bundle(programs.read_bundle(Path(args.bundle)))
            image_env = auto_image_env() if args.image_env == AUTO else read_image_env(args.image_env)
            prepare_image(root, exec_user, verifier_user)
        except (ValueError, OSError) as error:
            print(f"sandfleet-agent: --bundle: {error}", file=sys.stderr)
            return 2
    roots = extra_roots(args.extra_root, Path(args.logs_dir))
    if exec_user is not None:  # users split (the agent is root): the commands' user needs its logs
        try:
            prepare_episode_logs(Path(args.logs_dir), exec_user)
        except OSError as error:
            print(f"sandfleet-agent: cannot prepare --logs-dir: {error}", file=sys.stderr)
            return 2
    pristine = Path(args.pristine_dir) if args.pristine_dir else None
    # Everywhere the sandbox's users and the files routes can write (the rest of the image is root's).
    reset_roots = (root, *(Path(p) for p in RESET_ROOTS), *roots)
    if pristine is not None:
        try:
            reset.capture(reset_roots, pristine)
        except OSError as error:
            print(
                f"sandfleet-agent: cannot copy the writable roots to --pristine-dir: {error}",
                file=sys.stderr,
            )
            return 2
    config = AgentConfig(
        root=root,
        logs_dir=Path(args.logs_dir),
        token=token or None,
        verbose=args.verbose,
        exec_user=exec_user,
        verifier_user=verifier_user,
        extra_roots=roots,
        pristine=pristine,
        reset_roots=reset_roots,
        image_env=image_env,
    )
    try:
        server = AgentServer((args.host, args.port), config)
    except OSError as error:
        print(f"sandfleet-agent: cannot listen on {args.host}:{args.port}: {error.strerror}", file=sys.stderr)
        return 2

    if pristine is not None:
        # Taken listening and before anything runs: exactly what a reset must give back.
        config.golden = probe.fingerprint([str(r) for r in reset_roots])

    def stop(signum: int, frame: FrameType | None) -> None:
        # shutdown() waits for serve_forever to return, so it cannot run on the serving thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if os.getpid() == 1:
        reaper.start()
    print(
        f"sandfleet-agent listening on {args.host}:{server.server_address[1]} root={server.workspace.root}",
        file=sys.stderr,
        flush=True,
    )
    try:
        # shutdown() is noticed only when the accept loop wakes: 0.05 s keeps a stop prompt (the
        # default 0.5 s added that much to every sandbox's and every test's teardown).
        server.serve_forever(poll_interval=0.05)
    finally:
        server.jobs.kill_all()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
