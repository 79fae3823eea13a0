"""Give a benchmark's process a CPU quota of its own (a cgroup), as a Pod's `limits.cpu` gives a replica.

On one 2-core machine, three gateway replicas compete with each other, the apiserver and the load
generator for the same cores, so "do replicas add capacity" cannot be read from raw throughput. On a
cluster each replica is a Pod with a CPU budget of its own; the kubelet enforces a limit as a CFS
quota. This does the same to a local process: cgroup v2 `cpu.max`, or cgroup v1
`cpu.cfs_quota_us`, under one group per benchmark, removed afterwards.

Whether the quota is in force is read back, not inferred from throttling: a correct run can use
less CPU than its quota (a loaded machine may never give the process its share), so `check` reads
the group's quota and period and whether `/proc/<pid>/cgroup` names the group.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TypedDict

PERIOD_US = 100_000
ROOT = Path("/sys/fs/cgroup")
PROC = Path("/proc")


class QuotaInForce(TypedDict):
    """A confined process's quota as the kernel reports it: `quota_us` None is no limit."""

    quota_us: int | None
    period_us: int
    member: bool  # /proc/<pid>/cgroup names the group (for the CPU controller)


class CpuQuotas:
    """Child cgroups of `/sys/fs/cgroup[/cpu]/<name>`, one per confined process.

    `root` and `proc` are the cgroup and proc mounts (other directories in tests).
    """

    def __init__(self, name: str, root: Path = ROOT, proc: Path = PROC) -> None:
        # cgroup v2 only when it is mounted at the root: a hybrid machine's v2 tree (at
        # `unified`) has no CPU controller, its v1 `cpu` hierarchy does.
        unified = (root / "cgroup.controllers").exists()
        self.v2 = unified
        self.proc = proc
        self.hierarchy = root if unified else root / "cpu"
        self.base = self.hierarchy / name
        if not unified and not (self.hierarchy / "cpu.cfs_quota_us").exists():
            raise SystemExit(
                f"no CPU controller at {self.hierarchy} or a cgroup v2 mount at {root}: "
                "the per-replica CPU quota needs one (run as root on a Linux host)"
            )
        self.groups: list[Path] = []
        self.confined: dict[int, Path] = {}  # pid -> its group

    def confine(self, pid: int, cores: float, label: str) -> QuotaInForce:
        """Limit process `pid` to `cores` CPUs from now on; the quota as read back from the kernel.

        Exits when the read-back is not the quota set, or the process is not in the group.
        """
        quota = int(cores * PERIOD_US)
        try:
            self._confine(pid, quota, label)
            in_force = self.check(pid)
        except OSError as error:
            raise SystemExit(
                f"cannot give process {pid} a CPU quota under {self.base}: {error} (the per-replica "
                "quota needs root and a cgroup CPU controller this process may delegate)"
            ) from error
        wanted = QuotaInForce(quota_us=quota, period_us=PERIOD_US, member=True)
        if in_force != wanted:
            raise SystemExit(
                f"process {pid}'s CPU quota under {self.base} reads back {in_force}, not {wanted}"
            )
        return in_force

    def _confine(self, pid: int, quota: int, label: str) -> None:
        if self.v2:
            self.base.mkdir(exist_ok=True)
            # A v2 group's children get a controller only when their parent passes it down.
            (self.base.parent / "cgroup.subtree_control").write_text("+cpu")
            (self.base / "cgroup.subtree_control").write_text("+cpu")
        group = self.base / f"{label}-{pid}"
        group.mkdir(parents=True, exist_ok=True)
        if self.v2:
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        (group / "cgroup.procs").write_text(str(pid))
        self.groups.append(group)
        self.confined[pid] = group

    def check(self, pid: int) -> QuotaInForce:
        """The quota of confined process `pid`'s group, and whether the process is (still) in it."""
        group = self.confined[pid]
        if self.v2:
            quota, period = (group / "cpu.max").read_text().split()
        else:
            quota = (group / "cpu.cfs_quota_us").read_text().strip()
            period = (group / "cpu.cfs_period_us").read_text().strip()
        unlimited = quota in ("max", "-1")
        return QuotaInForce(
            quota_us=None if unlimited else int(quota), period_us=int(period), member=self._member(pid, group)
        )

    def _member(self, pid: int, group: Path) -> bool:
        """Whether /proc/<pid>/cgroup puts the process in `group` for the CPU controller."""
        try:
            lines = (self.proc / str(pid) / "cgroup").read_text().splitlines()
        except OSError:  # the process is gone
            return False
        wanted = "/" + group.relative_to(self.hierarchy).as_posix()
        for line in lines:
            # "hierarchy-id:controllers:path": v2's one line has no controllers ("0::/path"); on
            # v1 the CPU controller's line may name it with others ("4:cpu,cpuacct:/path").
            _, controllers, path = line.split(":", 2)
            if (controllers == "") if self.v2 else ("cpu" in controllers.split(",")):
                # Relative to the cgroup namespace's root, which may lie above the mount's (a
                # container's): the group's uniquely named tail is what must match.
                return path.endswith(wanted)
        return False

    def throttled(self) -> int:
        """How many times, so far, a confined process used up its quota and had to wait (all groups)."""
        count = 0
        for group in self.groups:
            for line in (group / "cpu.stat").read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "nr_throttled":
                    count += int(value)
        return count

    def remove(self) -> None:
        """Remove the groups; a process still in one goes back to the root group first."""
        parent = self.base.parent
        for group in self.groups:
            with contextlib.suppress(OSError):
                for pid in (group / "cgroup.procs").read_text().split():
                    (parent / "cgroup.procs").write_text(pid)
            with contextlib.suppress(OSError):
                os.rmdir(group)
        with contextlib.suppress(OSError):
            os.rmdir(self.base)
        self.groups = []
        self.confined = {}
