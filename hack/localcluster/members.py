"""Several local clusters side by side, as a fleet's members: each with its own etcd, apiserver and kwok.

Member 0 is the local cluster itself (its state directory and ports, `SANDFLEET_CLUSTER_DIR` and
`SANDFLEET_*_PORT` included). Member i beside it keeps its state in `<state dir>-m<i>`, listens on
every port of member 0 plus i x MEMBER_PORT_STEP, and gives its Pods addresses from a range of its
own, so a gateway that serves several members never sees one address in two clusters.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path

from localcluster.cluster import LocalCluster, Ports

# Clear of the other clusters the tests and benchmarks run (their ports are 1,000 or more apart).
MEMBER_PORT_STEP = 100
MAX_MEMBERS = 9


def member_dir(base: Path, index: int) -> Path:
    return base if index == 0 else base.with_name(f"{base.name}-m{index}")


def member_ports(base: Ports, index: int) -> Ports:
    shift = index * MEMBER_PORT_STEP
    return Ports(**{field.name: getattr(base, field.name) + shift for field in dataclasses.fields(Ports)})


def member_pod_cidr(base: str, index: int) -> str:
    """Member i's Pod range: the base range's i-th neighbour of the same size (10.244/16 -> 10.245/16)."""
    network = ipaddress.ip_network(base)
    first = int(network.network_address) + index * network.num_addresses
    return str(ipaddress.ip_network((first, network.prefixlen)))


def member(index: int, base: LocalCluster | None = None) -> LocalCluster:
    """Member `index` of the fleet whose member 0 is `base` (the local cluster by default)."""
    if not 0 <= index < MAX_MEMBERS:
        raise ValueError(f"a member's index is 0 to {MAX_MEMBERS - 1}, not {index}")
    base = base or LocalCluster()
    if index == 0:
        return base
    return LocalCluster(
        member_dir(base.state_dir, index),
        member_ports(base.ports, index),
        member_pod_cidr(base.pod_cidr, index),
    )


def members(count: int, base: LocalCluster | None = None) -> list[LocalCluster]:
    if not 1 <= count <= MAX_MEMBERS:
        raise ValueError(f"--clusters must be 1 to {MAX_MEMBERS}, not {count}")
    base = base or LocalCluster()
    return [member(index, base) for index in range(count)]


def started_members(base: LocalCluster | None = None) -> list[LocalCluster]:
    """Member 0 and every other member whose state directory exists (running or left half-stopped)."""
    base = base or LocalCluster()
    return [base] + [m for m in (member(i, base) for i in range(1, MAX_MEMBERS)) if m.state_dir.exists()]
