"""The `real_cluster` fixture: a separate cluster with one real gVisor node, for the whole session.

Other e2e suites (the helm chart's) reuse it by importing the fixture into their own conftest.py:
`from tests.e2e.real_node.conftest import real_cluster  # noqa: F401`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.e2e.real_node.cluster import RealCluster, RealClusterError


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[RealCluster]:
    """`hack/cluster up --real-node --nodes 0` under its own state dir and ports; down at the end.

    One real node fits on a host, so a session that finds it already running (a concurrent suite's,
    or a benchmark's) uses it and leaves it to its owner: only the session that started it stops it.
    A cluster that cannot start fails every test that needs it, with the reason; never a skip.
    """
    if os.geteuid() != 0:
        pytest.fail("the real node needs root (containerd, network interfaces, iptables, cgroups)")
    cluster = RealCluster()
    try:
        owner = cluster.up()
    except RealClusterError as error:
        try:
            cluster.down()
        finally:
            pytest.fail(f"the real-node cluster did not start:\n{error}")
    try:
        yield cluster
    finally:
        if owner:
            cluster.down()
