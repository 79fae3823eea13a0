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
    """Read `UID:GID` (or `none`, for an agent that runs commands as itself)."""
    if text == "none":
        return None
    uid_text, _, gid_text = text.partition(":")
    if not uid_text.isdigit() or not (gid_text or uid_text).isdigit():
        raise ValueError(f"{text!r} is not UID:GID (numbers) or 'none'")
    uid = int(uid_text)
    if uid == 0:
        raise ValueError("commands may not run as root (uid 0); give a non-zero UID:GID")
    return Identity(uid=uid, gid=int(gid_text or uid_text), home=home)


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
