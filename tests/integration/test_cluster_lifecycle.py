"""hack/cluster's own life cycle, on a second cluster (and a member beside it): up, reuse, resize,
status, down with nothing left."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
# Ports clear of every other cluster the tests and benchmarks start (tests/unit/hack/test_cluster.py
# checks) and below the ephemeral range, so they run at once; member 1 listens on each plus 100.
PORTS = {
    "APISERVER": 19443,
    "ETCD": 19379,
    "ETCD_PEER": 19380,
    "CONTROLLER_MANAGER": 19257,
    "SCHEDULER": 19259,
    "KWOK": 19247,
}


@pytest.fixture
def second_cluster(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = dict(os.environ, SANDFLEET_CLUSTER_DIR=str(tmp_path / "cluster"))
    env.update({f"SANDFLEET_{name}_PORT": str(port) for name, port in PORTS.items()})
    yield env
    subprocess.run([str(REPO / "hack" / "cluster"), "down"], env=env, capture_output=True)  # every member


def hack_cluster(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / "hack" / "cluster"), *args], env=env, capture_output=True, text=True, timeout=600
    )


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if text in cmdline and state != "Z":
            found.append(cmdline)
    return found


def kubectl(env: dict[str, str], kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    bin_dir = hack_cluster(env, "bin-dir").stdout.strip()
    return subprocess.run(
        [f"{bin_dir}/kubectl", f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_up_reuse_resize_status_down_leaves_nothing(second_cluster: dict[str, str]) -> None:
    env = second_cluster
    state_dir = env["SANDFLEET_CLUSTER_DIR"]
    # Member 1 of `--clusters 2`: beside it, every port 100 up.
    member_ports = {name: port + 100 for name, port in PORTS.items()}

    up = hack_cluster(env, "up", "--clusters", "2", "--nodes", "6", "--gpu-nodes", "0")
    assert up.returncode == 0, up.stderr
    assert up.stderr.count("cluster ready in") == 2
    status = hack_cluster(env, "status")
    assert status.returncode == 0, status.stdout
    assert status.stdout.count("asia-southeast1=2, europe-west4=2, us-east1=2") == 2
    assert f"-- member 1: {state_dir}-m1" in status.stdout
    kubeconfig = hack_cluster(env, "kubeconfig").stdout.strip()
    assert kubeconfig == f"{state_dir}/admin.kubeconfig"
    member = hack_cluster(env, "kubeconfig", "--member", "1").stdout.strip()
    assert member == f"{state_dir}-m1/admin.kubeconfig"
    assert f"127.0.0.1:{member_ports['APISERVER']}" in Path(member).read_text()
    # Two clusters, not two doors to one: what is made in one is not in the other.
    assert kubectl(env, member, "create", "namespace", "only-in-member-1").returncode == 0
    assert kubectl(env, member, "get", "namespace", "only-in-member-1").returncode == 0
    assert "NotFound" in kubectl(env, kubeconfig, "get", "namespace", "only-in-member-1").stderr
    assert all(listening(port) for name, port in member_ports.items() if name != "ETCD_PEER")

    again = hack_cluster(env, "up", "--nodes", "12", "--gpu-nodes", "1")
    assert again.returncode == 0, again.stderr
    assert "reusing the running cluster" in again.stderr
    assert "creating 7 simulated nodes" in again.stderr
    assert "asia-southeast1=4, europe-west4=4, us-east1=5" in hack_cluster(env, "status").stdout

    assert all(listening(port) for name, port in PORTS.items() if name != "ETCD_PEER")
    down = hack_cluster(env, "down")
    assert down.returncode == 0, down.stderr
    assert processes_mentioning(state_dir) == []  # the member's directory starts with it too
    assert not any(listening(port) for port in [*PORTS.values(), *member_ports.values()])
    assert not Path(state_dir).exists()
    assert not Path(f"{state_dir}-m1").exists()
    stopped = hack_cluster(env, "status")
    assert stopped.returncode == 1
    assert "not running" in stopped.stdout


def test_bad_node_count_is_a_clear_error(second_cluster: dict[str, str]) -> None:
    result = hack_cluster(second_cluster, "up", "--nodes", "2")
    assert result.returncode == 2
    assert "--nodes must be 0 or at least 6" in result.stderr
    assert "Traceback" not in result.stderr
    assert not Path(second_cluster["SANDFLEET_CLUSTER_DIR"]).exists(), "nothing should have started"
