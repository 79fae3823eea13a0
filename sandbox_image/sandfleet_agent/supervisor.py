"""Starts each command under a supervisor of its own that every process it starts stays beneath.

The supervisor is a fork of the agent that keeps the agent's (root) credentials, leads a new
session, and is a child subreaper (PR_SET_CHILD_SUBREAPER): a double-forked, `setsid` grandchild
whose parent exits is reparented to it, not to PID 1, so the supervisor's descendants are exactly
the processes the command started. The command runs as the sandbox user, which cannot signal
the supervisor, so it cannot cut itself loose. The supervisor reports the command's exit status
and then waits to be released, so killing the tree never races the supervisor's own exit.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NoReturn

from sandfleet_agent import reaper
from sandfleet_agent.users import Identity

_PR_SET_CHILD_SUBREAPER = 36
# Rounds of find-and-kill are repeated until the tree is empty, within this long.
KILL_DEADLINE_S = 5.0
_libc = ctypes.CDLL(None, use_errno=True)


class SpawnError(Exception):
    """The command could not be started; `errno` says why and `in_cwd` whether changing directory failed."""

    def __init__(self, code: int, in_cwd: bool) -> None:
        super().__init__(os.strerror(code))
        self.errno = code
        self.in_cwd = in_cwd


@dataclass
class Supervised:
    """A running command: its pipes, its pid, and the supervisor whose subtree holds all it started."""

    supervisor: int
    pid: int
    stdin: BinaryIO | None
    stdout: BinaryIO
    stderr: BinaryIO
    _report: int
    _release: int
    _buffer: bytes = b""
    _status: int | None = None
    _released: bool = False
    returncode: int | None = field(default=None)

    def poll(self) -> int | None:
        """The command's exit code (negative: killed by that signal), or None while it runs."""
        if self.returncode is None:
            self._read_report(block=False)
        return self.returncode

    def wait(self) -> int:
        """Wait for the command to exit, then release and collect its supervisor."""
        while self.returncode is None:
            if not self._read_report(block=True):
                self.returncode = -signal.SIGKILL
        self.release()
        return self.returncode

    def kill(self) -> None:
        """SIGKILL every process the command started, wherever it moved to, until none is left."""
        kill_tree(self.supervisor)

    def release(self) -> None:
        """Let the supervisor exit (what the command left running is reparented to PID 1) and reap it."""
        if self._released:
            return
        self._released = True
        os.close(self._release)
        with suppress(ChildProcessError):
            os.waitpid(self.supervisor, 0)
        reaper.forget(self.supervisor)
        os.close(self._report)

    def _read_report(self, *, block: bool) -> bool:
        """Read the supervisor's messages; False once it is gone without reporting an exit."""
        os.set_blocking(self._report, block)
        while b"\n" not in self._buffer:
            try:
                chunk = os.read(self._report, 64)
            except BlockingIOError:
                return True
            if not chunk:
                return False
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        kind, _, value = line.partition(b" ")
        if kind == b"X":
            self.returncode = os.waitstatus_to_exitcode(int(value))
        return True


def spawn(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    with_stdin: bool,
    user: Identity | None,
) -> Supervised:
    """Start `argv` under a fresh supervisor; raise SpawnError if it cannot start."""
    stdin_r, stdin_w = os.pipe() if with_stdin else (os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    report_r, report_w = os.pipe()
    release_r, release_w = os.pipe()
    child_ends = (stdin_r, out_w, err_w, report_w, release_r)
    with reaper.spawning() as register:
        supervisor = os.fork()
        if supervisor == 0:
            _supervise(argv, cwd, env, user, child_ends)
        register(supervisor)
    for end in child_ends:
        os.close(end)
    proc = Supervised(
        supervisor=supervisor,
        pid=0,
        stdin=os.fdopen(stdin_w, "wb", buffering=0) if stdin_w >= 0 else None,
        stdout=os.fdopen(out_r, "rb", buffering=0),
        stderr=os.fdopen(err_r, "rb", buffering=0),
        _report=report_r,
        _release=release_w,
    )
    started = _first_line(report_r)
    kind, _, value = started.partition(b" ")
    if kind == b"S":
        proc.pid = int(value)
        return proc
    proc.release()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    if kind == b"E":
        code, _, where = value.partition(b" ")
        raise SpawnError(int(code), where == b"cwd")
    raise SpawnError(errno.ECHILD, False)


def _first_line(fd: int) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            break
        line += chunk
    return line.strip()


def _supervise(
    argv: list[str], cwd: Path, env: dict[str, str], user: Identity | None, ends: tuple[int, ...]
) -> NoReturn:
    """The supervisor's whole life (in the forked child): never returns into the agent's code."""
    stdin_r, out_w, err_w, report, release = ends
    try:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(signum, signal.SIG_DFL)
        os.setsid()
        # Nothing but the command's own ends: inherited client sockets would stay open while it runs.
        for entry in os.listdir("/proc/self/fd"):
            fd = int(entry)
            if fd > 2 and fd not in ends:
                with suppress(OSError):
                    os.close(fd)
        if _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            os.write(report, b"E %d supervisor\n" % ctypes.get_errno())
            os._exit(1)
        try:
            if user is None:
                child = subprocess.Popen(
                    argv, cwd=cwd, env=env, stdin=stdin_r, stdout=out_w, stderr=err_w, close_fds=True
                )
            else:
                child = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=stdin_r,
                    stdout=out_w,
                    stderr=err_w,
                    close_fds=True,
                    user=user.uid,
                    group=user.gid,
                    extra_groups=[],
                )
        except OSError as error:
            where = b"cwd" if error.filename == str(cwd) else b"argv"
            os.write(report, b"E %d %s\n" % (error.errno or errno.EINVAL, where))
            os._exit(1)
        for end in (stdin_r, out_w, err_w):
            os.close(end)
        os.write(report, b"S %d\n" % child.pid)
        # Reap orphans as they die (a subreaper inherits them) until the command itself exits.
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == child.pid:
                break
        os.write(report, b"X %d\n" % status)
        os.read(release, 1)
    finally:
        os._exit(0)


def descendants(ancestor: int) -> list[int]:
    """Live (non-zombie) processes below `ancestor` in the process tree."""
    children: dict[int, list[int]] = {}
    alive: set[int] = set()
    for pid, fields in reaper.proc_stats():
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(pid)
            if fields[0] != b"Z":
                alive.add(pid)
    found: list[int] = []
    frontier = [ancestor]
    while frontier:
        for child in children.get(frontier.pop(), []):
            frontier.append(child)
            if child in alive:
                found.append(child)
    return found


def kill_tree(supervisor: int, deadline_s: float = KILL_DEADLINE_S) -> bool:
    """SIGKILL everything below a supervisor, sweeping until nothing is left; True once empty.

    While the supervisor lives, a process that forks during the sweep is still beneath it (its
    parent's death hands it to the supervisor), so the next sweep finds it.
    """
    deadline = time.monotonic() + deadline_s
    while True:
        doomed = descendants(supervisor)
        if not doomed:
            return True
        if time.monotonic() >= deadline:
            return False
        for pid in doomed:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
