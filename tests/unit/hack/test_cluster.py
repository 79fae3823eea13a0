"""The local cluster's ports: a cluster never starts on ports another already holds, and the clusters
the tests and benchmarks start side by side never share one."""

from __future__ import annotations

import dataclasses
import importlib
import socket
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from localcluster.addresses import REAL_NODE_TEST_ENV
from localcluster.cluster import Ports, ports_in_use
from localcluster.members import MEMBER_PORT_STEP
from tests.integration import test_cluster_lifecycle
from tests.integration.faults import conftest as faults
from tests.integration.gateway import test_fleet

BENCH = Path(__file__).resolve().parents[3] / "bench"


def test_a_port_something_listens_on_is_named() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            unused = free.getsockname()[1]  # bound, never listening: nobody answers there
            ports = dataclasses.replace(Ports(), etcd_client=port, etcd_peer=unused)
            busy = ports_in_use(ports)
    assert f"SANDFLEET_ETCD_PORT={port}" in busy
    assert not [b for b in busy if b.startswith("SANDFLEET_ETCD_PEER_PORT")]


def _env_ports(env: Mapping[str, str], members: int = 1) -> set[int]:
    base = {int(value) for key, value in env.items() if key.endswith("_PORT")}
    return {port + MEMBER_PORT_STEP * index for port in base for index in range(members)}


@pytest.fixture
def bench_modules() -> Iterator[None]:
    sys.path.insert(0, str(BENCH))
    yield
    sys.path.remove(str(BENCH))


def test_the_clusters_of_the_tests_and_benchmarks_share_no_port(bench_modules: None) -> None:
    # Any of them may still run when another starts (the fault suites and the real node keep
    # theirs up), and a second etcd on a port would leave its apiserver writing to the first.
    kubebench = importlib.import_module("kubebench")
    fleet_bench = importlib.import_module("fleet")
    clusters = {
        "shared test cluster": set(dataclasses.asdict(Ports()).values()),
        "fault suites": _env_ports(faults.CLUSTER_ENV) | {faults.AGENT_PORT},
        "lifecycle test (2 members)": _env_ports(
            {f"{k}_PORT": str(v) for k, v in test_cluster_lifecycle.PORTS.items()}, 2
        ),
        "fleet tests (3 members)": _env_ports({f"{k}_PORT": str(v) for k, v in test_fleet.PORTS.items()}, 3),
        "real node": _env_ports(REAL_NODE_TEST_ENV),
        "benchmarks": _env_ports(kubebench.BENCH_CLUSTER_ENV),
        "scale benchmark": _env_ports(kubebench.SCALE_CLUSTER_ENV),
        "fleet benchmark (3 members)": _env_ports(fleet_bench.FLEET_ENV, 3),
    }
    names = list(clusters)
    for index, first in enumerate(names):
        for second in names[index + 1 :]:
            shared = clusters[first] & clusters[second]
            assert not shared, f"{first} and {second} share ports {sorted(shared)}"
