"""Give a benchmark's process a CPU quota of its own (a cgroup), as a Pod's `limits.cpu` gives a replica.

On one 2-core machine, three gateway replicas compete with each other, the apiserver and the load
generator for the same cores, so "do replicas add capacity" cannot be read from raw throughput. On a
cluster each replica is a Pod with a CPU budget of its own; the kubelet enforces a limit as a CFS
quota. This does the same to a local process: cgroup v2 `cpu.max`, or cgroup v1
`cpu.cfs_quota_us`, under one group per benchmark, removed afterwards.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PERIOD_US = 100_000
ROOT = Path("/sys/fs/cgroup")


class CpuQuotas:
    """Child cgroups of `/sys/fs/cgroup[/cpu]/<name>`, one per confined process."""

    def __init__(self, name: str) -> None:
        unified = (ROOT / "cgroup.controllers").exists()
        self.v2 = unified
        self.base = (ROOT if unified else ROOT / "cpu") / name
        if not unified and not (ROOT / "cpu" / "cpu.cfs_quota_us").exists():
            raise SystemExit(
                "no CPU controller at /sys/fs/cgroup/cpu or a cgroup v2 mount at /sys/fs/cgroup: "
                "the per-replica CPU quota needs one (run as root on a Linux host)"
            )
        self.groups: list[Path] = []

    def confine(self, pid: int, cores: float, label: str) -> None:
        """Limit process `pid` to `cores` CPUs from now on."""
        try:
            self._confine(pid, cores, label)
        except OSError as error:
            raise SystemExit(
                f"cannot give process {pid} a CPU quota under {self.base}: {error} (the per-replica "
                "quota needs root and a cgroup CPU controller this process may delegate)"
            ) from error

    def _confine(self, pid: int, cores: float, label: str) -> None:
        if self.v2:
            self.base.mkdir(exist_ok=True)
            # A v2 group's children get a controller only when their parent passes it down.
            (self.base.parent / "cgroup.subtree_control").write_text("+cpu")
            (self.base / "cgroup.subtree_control").write_text("+cpu")
        group = self.base / f"{label}-{pid}"
        group.mkdir(parents=True, exist_ok=True)
        quota = int(cores * PERIOD_US)
        if self.v2:
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        (group / "cgroup.procs").write_text(str(pid))
        self.groups.append(group)

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
