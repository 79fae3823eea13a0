"""Starts a command as its user, labelled so that every process it ever starts can be found and ended.

Each command gets a marker group of its own as its one supplementary group (a gid no file and no
/etc/group entry names, so it grants nothing). Dropping or changing supplementary groups needs
CAP_SETGID, which a command never has, and every child inherits them: a double-forked `setsid`
grandchild reparented to PID 1 still carries the marker. Ending the command is a sweep of the
process table for the marker, repeated until nothing carries it (a fork loop only adds processes
the next sweep finds). It costs one extra exec per command (setpriv), not a fork of the agent.
An agent that cannot switch users (not root) falls back to walking the command's tree, group and
session, which a double fork escapes.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import threading
import time
from contextlib import suppress
from pathlib import Path

from sandfleet_agent import programs, reaper
from sandfleet_agent.users import Identity

# Marker groups: far above any gid an image assigns; one per command, not reused while the agent
# lives (a command may leave a server running that still carries its marker).
MARKER_BASE = 0x4000_0000
MARKER_SPAN = 0x1000_0000
KILL_DEADLINE_S = 5.0
# Rounds of find-and-kill for the fallback, whose members keep forking while they are killed.
KILL_SWEEPS = 5

_markers = itertools.count()
_lock = threading.Lock()


class SpawnError(Exception):
    """The command could not be started: `code` is an errno, `in_cwd` says whether the cwd was at fault."""

    def __init__(self, code: int, in_cwd: bool = False) -> None:
        super().__init__(os.strerror(code))
        self.code = code
        self.in_cwd = in_cwd


class Command:
    """A running command: its pipes and pid, and the marker every process it starts carries."""

    def __init__(self, proc: subprocess.Popen[bytes], marker: int | None) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.stdin = proc.stdin
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.marker = marker

    def poll(self) -> int | None:
        """The exit code (negative: the signal), or None while it runs."""
        return self.proc.poll()

    def wait(self) -> int:
        """Wait for the command itself and collect it (processes it left keep running, and its marker)."""
        code = self.proc.wait()
        reaper.forget(self.proc.pid)
        return code

    def kill(self) -> bool:
        """SIGKILL every process the command started, wherever it went; True once none is left."""
        if self.marker is None:
            # The fallback finds members by walking the tree, so nothing may die before the walk.
            kill_group(self.proc.pid)
            return True
        if self.proc.returncode is None:
            # The leader is not reaped yet, so its group id is still ours: one atomic kill ends at
            # once whatever never left the group (a fork loop there would outpace any sweep).
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        return kill_marked(self.marker)


def start(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    with_stdin: bool,
    user: Identity | None,
    pass_fds: tuple[int, ...] = (),
) -> Command:
    """Start `argv` in a new session, as `user` with a fresh marker group when given.

    `pass_fds` stay open in the command under their numbers (the scorer's results pipe).
    """
    marker = None if user is None else _new_marker()
    # Set only when the forked child switches users itself (a fork of the agent, not a vfork).
    uid: int | None = None
    gid: int | None = None
    groups: list[int] | None = None
    if user is not None:
        _check_runnable(argv[0], cwd, env)
        if switch_by_setpriv(env):
            # no_new_privs is already set on the sandbox's first process (the OCI spec's
            # noNewPrivileges, the Pod's allowPrivilegeEscalation: false) and gVisor ignores set-id
            # bits unless runsc is given --allow-suid; setting it again here keeps a setuid-root
            # program from giving a command root even where the agent is started without it.
            argv = [
                *programs.setpriv(),
                *(f"--reuid={user.uid}", f"--regid={user.gid}", f"--groups={marker}", "--no-new-privs", "--"),
                *argv,
            ]
        else:
            uid, gid, groups = user.uid, user.gid, [marker] if marker is not None else []
    try:
        with reaper.spawning() as register:
            proc: subprocess.Popen[bytes] = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=pass_fds,
                user=uid,
                group=gid,
                extra_groups=groups,
            )
            register(proc.pid)
    except OSError as error:
        raise SpawnError(error.errno or 0, error.filename == str(cwd)) from None
    return Command(proc, marker)


def switch_by_setpriv(env: dict[str, str]) -> bool:
    """Whether setpriv may switch users for a command with this environment.

    The bundle's setpriv runs on the bundle's loader, which would load whatever the command's
    environment preloads (an image's `LD_PRELOAD`, built for the image's libc); such a command
    is switched by the forked agent instead. The image's own setpriv never minds.
    """
    return not programs.from_bundle() or not any(name.startswith("LD_") for name in env)


def _check_runnable(program: str, cwd: Path, env: dict[str, str]) -> None:
    """What Popen would report for the command itself, which runs behind setpriv's exec."""
    if "/" in program:
        path = Path(program) if os.path.isabs(program) else cwd / program
        if not path.exists():
            raise SpawnError(2)
        if path.is_dir() or not os.access(path, os.X_OK):
            raise SpawnError(13)
        return
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        candidate = Path(directory or ".") / program
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return
    raise SpawnError(2)


def _new_marker() -> int:
    with _lock:
        return MARKER_BASE + next(_markers) % MARKER_SPAN


def marked(marker: int) -> list[tuple[int, bytes]]:
    """Live (non-zombie) processes that carry a marker group, with their state letter."""
    found: list[tuple[int, bytes]] = []
    needle = str(marker).encode()
    for pid, fields in reaper.proc_stats():
        if not fields or fields[0] == b"Z":
            continue
        with suppress(OSError), open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"Groups:"):
                    if needle in line.split()[1:]:
                        found.append((pid, fields[0]))
                    break
    return found


def kill_marked(marker: int, deadline_s: float = KILL_DEADLINE_S) -> bool:
    """SIGKILL every process carrying the marker, wherever it went; True once none is left.

    A fork loop outpaces killing as we find: each kill frees a slot that a survivor refills. So
    everything marked is stopped first (a stopped process cannot fork), sweep after sweep until
    no marked process still runs, and only then killed.
    """
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        running = [pid for pid, state in marked(marker) if state not in (b"T", b"t")]
        if not running:
            break
        _signal_all(running, signal.SIGSTOP)
    while True:
        doomed = [pid for pid, _ in marked(marker)]
        if not doomed:
            return True
        if time.monotonic() >= deadline:
            return False
        _signal_all(doomed, signal.SIGKILL)


def _signal_all(pids: list[int], signum: signal.Signals) -> None:
    for pid in pids:
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def kill_group(leader: int) -> None:
    """Kill a command's process group and descendants that left it with setsid (the fallback).

    Members are found before anything is killed (once the leader dies its children are
    reparented and the tree can no longer be walked), and the sweep repeats while processes
    forked mid-kill still show up.
    """
    for _ in range(KILL_SWEEPS):
        doomed = _members(leader)
        if not doomed:
            return
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, signal.SIGKILL)
        for pid in doomed:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _members(leader: int) -> list[int]:
    children: dict[int, list[int]] = {}
    grouped: list[int] = []
    for pid, fields in reaper.proc_stats():
        if len(fields) > 3 and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(pid)
            if leader in (int(fields[2]), int(fields[3])):
                grouped.append(pid)
    found: list[int] = []
    frontier = [leader]
    while frontier:
        for child in children.get(frontier.pop(), []):
            found.append(child)
            frontier.append(child)
    return sorted(set(found) | set(grouped))
