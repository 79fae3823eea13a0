"""Member clusters side by side: each its own state directory, ports and Pod range, none shared."""

from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path

import pytest

from localcluster.cluster import LocalCluster, Ports
from localcluster.members import MAX_MEMBERS, member, members, started_members


def base(tmp_path: Path) -> LocalCluster:
    return LocalCluster(tmp_path / "cluster", Ports(), "10.244.0.0/16")


def test_member_0_is_the_cluster_itself(tmp_path: Path) -> None:
    cluster = base(tmp_path)
    assert member(0, cluster) is cluster


def test_no_two_members_share_a_directory_a_port_or_a_pod_address(tmp_path: Path) -> None:
    fleet = members(MAX_MEMBERS, base(tmp_path))
    assert len({cluster.state_dir for cluster in fleet}) == MAX_MEMBERS
    ports = [getattr(c.ports, f.name) for c in fleet for f in dataclasses.fields(Ports)]
    assert len(ports) == len(set(ports))
    assert all(1024 < port < 32768 for port in ports)  # below the ephemeral range
    ranges = [ipaddress.ip_network(cluster.pod_cidr) for cluster in fleet]
    assert not any(a.overlaps(b) for i, a in enumerate(ranges) for b in ranges[i + 1 :])
    assert [str(r) for r in ranges[:3]] == ["10.244.0.0/16", "10.245.0.0/16", "10.246.0.0/16"]
    assert fleet[2].state_dir == tmp_path / "cluster-m2"


def test_a_member_count_out_of_range_is_a_clear_error(tmp_path: Path) -> None:
    for count in (0, MAX_MEMBERS + 1):
        with pytest.raises(ValueError, match=f"--clusters must be 1 to {MAX_MEMBERS}"):
            members(count, base(tmp_path))


def test_started_members_are_those_with_state_left(tmp_path: Path) -> None:
    cluster = base(tmp_path)
    (tmp_path / "cluster-m2").mkdir()
    assert [m.state_dir.name for m in started_members(cluster)] == ["cluster", "cluster-m2"]
