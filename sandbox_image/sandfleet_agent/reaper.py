"""Reaps orphaned zombies when the agent is PID 1 in its sandbox, without stealing its own children.

Orphans (daemons a command left behind) are reparented to PID 1 and would stay zombies forever.
A blanket waitpid(-1) would also reap processes the agent is still waiting on, so children the
agent spawned itself are registered here, under a lock held from fork until registration.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

REAP_INTERVAL_S = 0.5

_lock = threading.Lock()
_ours: set[int] = set()


@contextmanager
def spawning() -> Iterator[Callable[[int], None]]:
    """Hold off the reaper while a child is forked; call the yielded function with its pid."""
    with _lock:
        yield _ours.add


def forget(pid: int) -> None:
    """The agent has collected this child itself."""
    with _lock:
        _ours.discard(pid)


def reap_orphans() -> int:
    """Reap zombie children the agent did not spawn; return how many."""
    me = os.getpid()
    reaped = 0
    with _lock:
        for pid in _zombie_children(me):
            if pid in _ours:
                continue
            try:
                os.waitpid(pid, os.WNOHANG)
                reaped += 1
            except ChildProcessError:
                pass
    return reaped


def proc_stats() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, the /proc/PID/stat fields after the command name) for every process we can read."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                raw = stat.read()
        except OSError:
            continue
        # The command name may contain spaces and parentheses; fields resume after the last ')'.
        yield int(entry), raw[raw.rfind(b")") + 2 :].split()


def _zombie_children(parent: int) -> list[int]:
    return [
        pid
        for pid, fields in proc_stats()
        if len(fields) > 1 and fields[0] == b"Z" and int(fields[1]) == parent
    ]


def start() -> None:
    """Reap in a background thread for the life of the process."""

    def loop() -> None:
        while True:
            time.sleep(REAP_INTERVAL_S)
            reap_orphans()

    threading.Thread(target=loop, name="reaper", daemon=True).start()
