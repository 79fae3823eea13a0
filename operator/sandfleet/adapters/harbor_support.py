"""The pure half of the Harbor environment: who runs a command, what its result says, tars both ways.

Kept apart from `sandfleet.adapters.harbor` (which needs the `harbor` package, Python 3.12+) so
the decisions are tested on plain data in any interpreter.
"""

from __future__ import annotations

import io
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
