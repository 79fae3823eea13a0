"""The users commands run as (the sandbox user, the verifier) and ending every process one of them owns."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import suppress
from dataclasses import dataclass
from http import HTTPStatus

from sandfleet_agent import programs, reaper
from sandfleet_agent.errors import AgentError

SANDBOX_UID = 1000
VERIFIER_UID = 1001
# How long ending a user's processes may take before evaluate gives up on the sandbox.
SWEEP_DEADLINE_S = 10.0
# Runs as the user whose processes must end: kill(-1) signals every process that user may signal
# (all of its own, never root's) in one kernel pass, so forks cannot outrun it; repeat until none.
_KILL_EVERYTHING = (
    "import os, signal, time\n"
    "deadline = time.monotonic() + float(os.environ['DEADLINE'])\n"
    "while time.monotonic() < deadline:\n"
    "    try:\n"
    "        os.kill(-1, signal.SIGKILL)\n"
    "    except ProcessLookupError:\n"
    "        break\n"
    "    time.sleep(0.002)\n"
)


@dataclass(frozen=True)
class Identity:
    """A user the agent starts commands as: no supplementary groups, and (not being root) no capabilities."""

    uid: int
    gid: int
    home: str


def parse_identity(text: str, home: str) -> Identity | None:
    """Read `UID:GID[:HOME]`, `root` (commands as root: the image's own user), or `none` (as the agent).

    Root is never a default: its processes can signal, trace and replace the agent's, so a sandbox
    whose commands run as root is scored elsewhere (its in-place evaluate is refused, see
    evaluate.py) and its agent is not trusted with a verdict.
    """
    if text == "none":
        return None
    if text == "root":
        return Identity(uid=0, gid=0, home="/root")
    uid_text, _, rest = text.partition(":")
    gid_text, _, own_home = rest.partition(":")
    if not uid_text.isdigit() or not (gid_text or uid_text).isdigit():
        raise ValueError(f"{text!r} is not UID:GID[:HOME] (numbers), 'root' or 'none'")
    if own_home and not own_home.startswith("/"):
        raise ValueError(f"{text!r}: HOME must be an absolute path")
    uid = int(uid_text)
    if uid == 0:
        raise ValueError("commands run as root only when asked for by name: give 'root', or a non-zero UID")
    return Identity(uid=uid, gid=int(gid_text or uid_text), home=own_home or home)


def is_root(user: Identity | None) -> bool:
    """Whether commands run as root (their processes may reach the agent's)."""
    return user is not None and user.uid == 0


def processes_of(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real or effective uid is `uid`."""
    found: list[int] = []
    for pid, fields in reaper.proc_stats():
        if not fields or fields[0] == b"Z":
            continue
        with suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"Uid:"):
                    real, effective = (int(part) for part in line.split()[1:3])
                    if uid in (real, effective):
                        found.append(pid)
                    break
    return found


def end_all_processes_of(user: Identity, deadline_s: float = SWEEP_DEADLINE_S) -> list[int]:
    """SIGKILL every process of `user` and wait until none is left; return the pids still alive.

    The kill runs as the user itself (kill(-1)), repeated, then the process table is checked; an
    empty list means nothing of that user survives.
    """
    deadline = time.monotonic() + deadline_s
    while True:
        survivors = processes_of(user.uid)
        if not survivors or time.monotonic() >= deadline:
            return survivors
        with reaper.spawning() as register:
            helper = subprocess.Popen(
                [*programs.python(), "-S", "-c", _KILL_EVERYTHING],
                env={"DEADLINE": str(max(deadline - time.monotonic(), 0.1))},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                cwd="/",
                user=user.uid,
                group=user.gid,
                extra_groups=[],
            )
            register(helper.pid)
        try:
            helper.wait(max(deadline - time.monotonic(), 0.1) + 1.0)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.kill(helper.pid, signal.SIGKILL)
            helper.wait()
        reaper.forget(helper.pid)
        # Killed processes are zombies until their parents (or the reaper) collect them.
        time.sleep(0.01)


def end_processes(user: Identity | None) -> None:
    """End every process of `user` (none to end when commands run as the agent); 503 if any survives."""
    if user is None:
        return
    survivors = end_all_processes_of(user)
    if survivors:
        raise AgentError(
            HTTPStatus.SERVICE_UNAVAILABLE,
            "processes_survive",
            f"{len(survivors)} processes of uid {user.uid} survived SIGKILL; release this sandbox",
        )
