"""bench/cpuquota.py's read-back of a confined process's quota, on fake cgroup and proc trees."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
PID = 4242
# /proc/<pid>/cgroup on a hybrid machine (cgroup v1 controllers, an empty v2 tree at `unified`),
# with the process's CPU group where `{cpu}` is.
HYBRID = "9:name=systemd:/\n4:memory:/job/1\n3:cpuset:/\n2:cpuacct:/\n1:cpu:{cpu}\n0::/\n"


@pytest.fixture
def cpuquota(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("cpuquota")


def _hybrid(tmp_path: Path) -> tuple[Path, Path]:
    """A cgroup v1 `cpu` hierarchy beside a v2 tree without controllers, and an empty /proc."""
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    (root / "cpu").mkdir(parents=True)
    (root / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (root / "unified").mkdir()
    (root / "unified" / "cgroup.controllers").write_text("")
    (proc / str(PID)).mkdir(parents=True)
    return root, proc


def _proc_cgroup(proc: Path, text: str) -> None:
    (proc / str(PID) / "cgroup").write_text(text)


def test_v1_quota_and_membership_are_read_back(cpuquota: ModuleType, tmp_path: Path) -> None:
    root, proc = _hybrid(tmp_path)
    _proc_cgroup(proc, HYBRID.format(cpu=f"/bench/gateway-{PID}"))
    quotas = cpuquota.CpuQuotas("bench", root=root, proc=proc)
    assert not quotas.v2  # the v2 tree at `unified` is not the one with a CPU controller
    in_force = quotas.confine(PID, 0.3, "gateway")
    assert in_force == {"quota_us": 30_000, "period_us": 100_000, "member": True}
    group = root / "cpu" / "bench" / f"gateway-{PID}"
    assert (group / "cpu.cfs_quota_us").read_text() == "30000"
    assert (group / "cpu.cfs_period_us").read_text() == "100000"
    assert (group / "cgroup.procs").read_text() == str(PID)
    assert quotas.check(PID) == in_force


def test_v1_membership_is_read_from_the_cpu_controllers_line(cpuquota: ModuleType, tmp_path: Path) -> None:
    root, proc = _hybrid(tmp_path)
    # The controller shares a hierarchy with cpuacct; cpuset's line is not the CPU controller's.
    _proc_cgroup(proc, f"5:cpuset:/bench/gateway-{PID}\n3:cpu,cpuacct:/bench/gateway-{PID}\n0::/\n")
    quotas = cpuquota.CpuQuotas("bench", root=root, proc=proc)
    assert quotas.confine(PID, 0.5, "gateway")["member"]
    # Seen from a cgroup namespace above the mount's root (a container's), the group's path is longer.
    _proc_cgroup(proc, f"3:cpu,cpuacct:/docker/ab12/bench/gateway-{PID}\n")
    assert quotas.check(PID)["member"]
    # Back in the root group (or named only by the v2 line): not a member.
    for text in (HYBRID.format(cpu="/"), f"1:cpu:/\n0::/bench/gateway-{PID}\n"):
        _proc_cgroup(proc, text)
        assert not quotas.check(PID)["member"]


def test_v2_quota_and_membership_are_read_back(cpuquota: ModuleType, tmp_path: Path) -> None:
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu io memory pids\n")
    (proc / str(PID)).mkdir(parents=True)
    _proc_cgroup(proc, f"0::/bench/gateway-{PID}\n")
    quotas = cpuquota.CpuQuotas("bench", root=root, proc=proc)
    assert quotas.v2
    assert quotas.confine(PID, 0.3, "gateway") == {"quota_us": 30_000, "period_us": 100_000, "member": True}
    group = root / "bench" / f"gateway-{PID}"
    assert (group / "cpu.max").read_text() == "30000 100000"
    assert (root / "bench" / "cgroup.subtree_control").read_text() == "+cpu"
    (group / "cpu.max").write_text("max 100000\n")  # no limit
    assert quotas.check(PID)["quota_us"] is None


def test_a_quota_not_in_force_is_reported(cpuquota: ModuleType, tmp_path: Path) -> None:
    root, proc = _hybrid(tmp_path)
    _proc_cgroup(proc, HYBRID.format(cpu=f"/bench/gateway-{PID}"))
    quotas = cpuquota.CpuQuotas("bench", root=root, proc=proc)
    quotas.confine(PID, 0.3, "gateway")
    (root / "cpu" / "bench" / f"gateway-{PID}" / "cpu.cfs_quota_us").write_text("-1\n")
    (proc / str(PID) / "cgroup").unlink()  # the process has exited
    assert quotas.check(PID) == {"quota_us": None, "period_us": 100_000, "member": False}


def test_confining_exits_when_the_process_is_not_in_the_group(cpuquota: ModuleType, tmp_path: Path) -> None:
    root, proc = _hybrid(tmp_path)
    _proc_cgroup(proc, HYBRID.format(cpu="/"))  # the write to cgroup.procs did not move it
    quotas = cpuquota.CpuQuotas("bench", root=root, proc=proc)
    with pytest.raises(SystemExit, match="reads back"):
        quotas.confine(PID, 0.3, "gateway")


def test_no_cpu_controller_is_an_error(cpuquota: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "unified").mkdir()
    with pytest.raises(SystemExit, match="no CPU controller"):
        cpuquota.CpuQuotas("bench", root=tmp_path, proc=tmp_path)
