"""Finds and removes what dead runtimes left on the host: containers, processes, networks, mounts.

Debris means runsc containers and processes, network namespaces and veths, mounts, cgroups and
state directories of runtimes that are no longer alive.

A runtime holds an exclusive flock on its instance directory's lock file for its whole life, so
a lock anyone can take means its owner died (crash, SIGKILL) and everything it owned is debris.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from tenacity import AsyncRetrying, retry_if_result, stop_after_delay, wait_fixed

from sandfleet.local import locks
from sandfleet.local.commands import run_command
from sandfleet.local.network import SlotTable, delete_network

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PARENT = "sandfleet"
RUNSC_PROCESS_NAMES = ("runsc", "runsc-sandbox", "runsc-gofer")
MNT_DETACH = 2
# A killed sandbox takes a moment to exit (its memory goes first), and its cgroups cannot be
# removed while a process is in them: how long a teardown waits for that.
EXIT_WAIT_SECONDS = 10.0
_LIBC = ctypes.CDLL(None, use_errno=True)


@dataclass
class CleanupReport:
    """What a cleanup removed."""

    instances: list[str] = field(default_factory=list)
    containers: int = 0
    processes: int = 0
    networks: int = 0
    mounts: int = 0
    cgroups: int = 0


def runsc_processes(runsc_root: Path) -> list[int]:
    """Pids of runsc, runsc-sandbox and runsc-gofer processes working on this runsc root."""
    marker = f"--root={runsc_root}".encode()
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if (
            argv
            and os.path.basename(argv[0].decode(errors="replace")) in RUNSC_PROCESS_NAMES
            and marker in argv
        ):
            found.append(int(entry))
    return found


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below a directory, deepest first."""
    prefix = str(directory).rstrip("/") + "/"
    points: list[str] = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            point = line.split()[4].replace("\\040", " ")
            if point == str(directory) or point.startswith(prefix):
                points.append(point)
    return sorted(set(points), key=len, reverse=True)


def unmount_all(directory: Path) -> int:
    """Lazily unmount everything mounted under a directory (stacked mounts included)."""
    count = 0
    for _ in range(16):
        points = mounts_under(directory)
        if not points:
            break
        for point in points:
            if _umount(point):
                count += 1
    return count


def _umount(point: str) -> bool:
    return bool(_LIBC.umount2(point.encode(), MNT_DETACH) == 0)


def remove_cgroups(container_prefix: str) -> int:
    """Remove the per-container cgroups runsc made, in every controller hierarchy."""
    removed = 0
    for child in _cgroups(container_prefix):
        with contextlib.suppress(OSError):
            child.rmdir()
            removed += 1
    return removed


async def remove_cgroups_settled(container_prefix: str, timeout_s: float = EXIT_WAIT_SECONDS) -> int:
    """remove_cgroups, again while some are busy (a process still leaving them), up to `timeout_s`."""
    removed = 0

    async def remove() -> bool:
        """Remove what can be; whether some are left."""
        nonlocal removed
        removed += remove_cgroups(container_prefix)
        return bool(_cgroups(container_prefix))

    retrying = AsyncRetrying(
        retry=retry_if_result(bool),
        wait=wait_fixed(0.1),
        stop=stop_after_delay(timeout_s),
        retry_error_callback=lambda _: None,  # those still busy at the timeout are left
    )
    await retrying(remove)
    return removed


def _cgroups(container_prefix: str) -> list[Path]:
    if not CGROUP_ROOT.is_dir():
        return []
    return [
        child
        for hierarchy in CGROUP_ROOT.iterdir()
        if (hierarchy / CGROUP_PARENT).is_dir()
        for child in (hierarchy / CGROUP_PARENT).iterdir()
        if child.is_dir() and child.name.startswith(container_prefix)
    ]


async def destroy_runsc_root(runsc: Path, runsc_root: Path, report: CleanupReport) -> None:
    """Kill and delete every container of a runsc root, then any process still using it."""
    if _is_dir(runsc_root):
        listing = await run_command(
            [str(runsc), f"--root={runsc_root}", "list", "--format=json"], check=False, timeout_s=30
        )
        try:
            containers = json.loads(listing.stdout or "[]") or []
        except ValueError:
            containers = []
        for container in containers:
            container_id = str(container.get("id", ""))
            if not container_id:
                continue
            await run_command([str(runsc), f"--root={runsc_root}", "kill", container_id, "KILL"], check=False)
            await run_command(
                [str(runsc), f"--root={runsc_root}", "delete", "--force", container_id],
                check=False,
                timeout_s=30,
            )
            report.containers += 1
    killed = []
    for pid in runsc_processes(runsc_root):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            report.processes += 1
    await until_exited(killed, EXIT_WAIT_SECONDS)


async def until_exited(pids: list[int], timeout_s: float) -> list[int]:
    """Wait until these processes have exited (a zombie has); those still running after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    running = [pid for pid in pids if _running(pid)]
    while running and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        running = [pid for pid in running if _running(pid)]
    return running


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]  # a zombie has left its cgroups


def _is_dir(path: Path) -> bool:
    # A stat on /run (tmpfs) never blocks long enough to matter to the event loop.
    return path.is_dir()


async def clean_dead_instances(runsc: Path, state_dir: Path, slots: SlotTable) -> CleanupReport:
    """Remove everything left by runtimes whose lock is free (they crashed or were killed)."""
    report = CleanupReport()
    instances_dir = state_dir / "instances"
    alive: set[str] = set()
    if instances_dir.is_dir():
        for instance in sorted(instances_dir.iterdir()):
            lock = locks.try_lock(instance / "lock") if instance.is_dir() else None
            if lock is None:
                alive.add(instance.name)
                continue
            try:
                await destroy_runsc_root(runsc, instance / "runsc", report)
                report.mounts += unmount_all(instance)
                report.cgroups += await remove_cgroups_settled(container_prefix(instance.name))
                shutil.rmtree(instance, ignore_errors=True)
                report.instances.append(instance.name)
            finally:
                os.close(lock)
    for slot, owner in slots.owners().items():
        if owner not in alive:
            await delete_network(slot)
            slots.free(slot)
            report.networks += 1
    return report


def container_prefix(instance_id: str) -> str:
    """Every runsc container id of an instance starts with this."""
    return f"sf-{instance_id}-"
