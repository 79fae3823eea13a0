"""The pure half of the Harbor environment: who runs a command, what its result says, tars both ways.

Two kinds of pool. On a user-split pool (the default) the episode's commands run as the sandbox
user and Harbor's root and verifier commands go through `evaluate`, as the verifier (`route`). On a
pool whose commands run as the image's user, root (`serve --local --commands-as-image-user`,
`commandsUser`), every command runs as root, so the lease the episode ran in can never hold the
verifier: Harbor's separate verifier environment (`[verifier] environment_mode = "separate"`) is a
fresh lease of the same image, and the episode's lease refuses Harbor's tests (`root_route`,
`refuse_tests_in_episode`).

Kept apart from `sandfleet.adapters.harbor` (which needs the `harbor` package, Python 3.12+) so
the decisions are tested on plain data in any interpreter.
"""

from __future__ import annotations

import io
import shlex
import tarfile
from enum import Enum
from pathlib import Path
from typing import Any

# Harbor asks for root to reset its directories and remove stale rewards, and for the task's
# verifier user to run the tests. sandfleet never runs a client's command as root: both go to
# the verifier (evaluate), which owns <logs>/verifier and runs only after every process of
# the episode has been ended.
VERIFIER_USERS = frozenset({"root", 0, "verifier", 1001})
# The episode's own commands: the sandbox user, Harbor's default (None) included.
SANDBOX_USERS = frozenset({None, "sandbox", 1000})
TIMED_OUT_EXIT = 124
# What a root pool's commands may be asked to run as: they run as root whatever is asked, so only
# names that mean root are taken (any other would be a silent lie about who ran it).
ROOT_USERS = frozenset({None, "root", 0})
# Harbor's own paths: the tests the verifier runs, and the logs a non-mounted environment makes.
HARBOR_TESTS_DIR = "/tests"
HARBOR_LOG_DIRS = ("/logs/agent", "/logs/verifier", "/logs/artifacts")
# `Trial._separate_verifier_session_id` (harbor 0.26): "<trial>__verifier__<key>".
SEPARATE_VERIFIER_MARK = "__verifier__"
# The agent's files routes reach the working area, /tests, /solution and /logs; a task's other paths
# (an artifact in /tmp, a WORKDIR-less image's /app) it refuses with this code. On a root pool the
# commands are root's anyway, so such a file moves as base64 through an exec instead.
OUTSIDE_ROOT_CODE = "path_outside_root"
TRANSFER_MAX_BYTES = 64 << 20


class Route(Enum):
    """Where one Harbor `exec` goes."""

    SANDBOX = "exec"
    VERIFIER = "evaluate"


class UnsupportedUserError(ValueError):
    """A user sandfleet cannot run a command as, named in one line."""


def route(user: str | int | None) -> Route:
    """The route for a command Harbor wants run as `user` (already resolved against its default)."""
    if user in VERIFIER_USERS:
        return Route.VERIFIER
    if user in SANDBOX_USERS:
        return Route.SANDBOX
    raise UnsupportedUserError(
        f"sandfleet runs commands as the sandbox user or the verifier only, not {user!r} "
        "(set the task's [agent] user to sandbox or unset, its [verifier] user to verifier)"
    )


class SharedVerifierError(RuntimeError):
    """Harbor asked to verify in the lease a root episode ran in, where the episode could reach it."""


def runs_as_root(id_output: str) -> bool:
    """Whether `id -u` in a fresh lease says this pool's commands run as root."""
    return id_output.strip() == "0"


def is_separate_verifier(session_id: str) -> bool:
    """Whether Harbor started this environment for its separate verifier, not for an episode."""
    return SEPARATE_VERIFIER_MARK in session_id


def root_route(user: str | int | None) -> Route:
    """The route on a root pool: every command is an exec, as root; other users are refused."""
    if user in ROOT_USERS:
        return Route.SANDBOX
    raise UnsupportedUserError(
        f"this pool runs every command as root, not as {user!r} "
        "(leave the task's [agent] user and [verifier] user unset, or set them to root)"
    )


def refuse_tests_in_episode(target_dir: str) -> None:
    """Refuse Harbor's tests in a root episode's lease: root could rewrite them or forge the reward."""
    normal = "/" + target_dir.strip("/")
    if normal == HARBOR_TESTS_DIR or normal.startswith(HARBOR_TESTS_DIR + "/"):
        raise SharedVerifierError(
            "on a pool whose commands run as root the verifier cannot run in the episode's sandbox: "
            'set [verifier] environment_mode = "separate" in task.toml (Harbor then verifies in a '
            "fresh sandbox of the same image, given only the task's declared artifacts)"
        )


def log_dirs_command() -> str:
    """The shell line making Harbor's log directories in a root lease (a mounted Docker trial has them)."""
    return "mkdir -p " + " ".join(HARBOR_LOG_DIRS)


def read_command(path: str, *, directory: bool) -> str:
    """A root shell line printing `path` (a file, or a directory as a gzipped tar) in base64."""
    quoted = shlex.quote(path)
    return f"tar -C {quoted} -czf - . | base64" if directory else f"base64 < {quoted}"


def write_command(path: str, *, directory: bool) -> str:
    """A root shell line writing base64 on stdin to `path` (a file, or a gzipped tar unpacked into it)."""
    quoted = shlex.quote(path)
    if directory:
        return f"mkdir -p -- {quoted} && base64 -d | tar --no-same-owner -xzf - -C {quoted}"
    parent = shlex.quote(path.rsplit("/", 1)[0] or "/")
    return f"mkdir -p -- {parent} && base64 -d > {quoted}"


def exit_code(code: object, timed_out: bool) -> int:
    """Harbor's return code: the command's, 124 when it timed out, -1 when it never reported one."""
    if timed_out:
        return TIMED_OUT_EXIT
    return code if isinstance(code, int) else -1


def verifier_output(report: dict[str, Any]) -> tuple[str, str, int]:
    """(stdout, stderr, return code) of a command run through evaluate, from its report."""
    run = dict(report.get("exec") or {})
    return (
        str(run.get("stdout_tail") or ""),
        str(run.get("stderr_tail") or ""),
        exit_code(run.get("exit_code"), bool(run.get("timed_out"))),
    )


def pack_dir(source: Path) -> bytes:
    """A gzipped tar of the contents of `source` (modes kept: Harbor's test.sh runs directly)."""
    if not source.is_dir():
        raise NotADirectoryError(f"{source} is not a directory")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for child in sorted(source.iterdir()):
            tar.add(child, arcname=child.name, recursive=True)
    return buffer.getvalue()


def unpack_into(archive: bytes, target: Path) -> list[str]:
    """Unpack a tar the sandbox sent into `target`, refusing links, devices and paths that leave it.

    The sandbox's contents are hostile: the "data" filter rejects absolute names, `..`, links out
    of `target` and special files, so nothing lands outside `target` on the trainer's host.
    """
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
        names = tar.getnames()
        tar.extractall(target, filter="data")
    return names
