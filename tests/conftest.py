"""Shared fixtures: the local cluster (started on demand, reused), a namespace per test, the CRDs."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.support.kube import Kubectl, wait_until

REPO = Path(__file__).resolve().parents[1]
CRDS = REPO / "manifests" / "crds"

# The suite gives the same answer every run; `explore` hunts at random locally (pin finds with @example).
settings.register_profile(
    "sandfleet",
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("explore", max_examples=1000, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("SANDFLEET_HYPOTHESIS_PROFILE", "sandfleet"))


def _hack_cluster(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / "hack" / "cluster"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def kubectl() -> Kubectl:
    """Admin kubectl on the local cluster: starts it if it is not running, reuses it if it is.

    A cluster that cannot start fails every test that needs it, with the reason; never a skip.
    """
    # The cold build runs from `make test` first; here it is a cache hit unless run alone.
    up = _hack_cluster("up", timeout=3600)
    if up.returncode != 0:
        pytest.fail(f"the local cluster did not start (hack/cluster up):\n{up.stderr[-4000:]}")
    kubeconfig = Path(_hack_cluster("kubeconfig", timeout=60).stdout.strip())
    bin_dir = Path(_hack_cluster("bin-dir", timeout=60).stdout.strip())
    admin = Kubectl(bin_dir / "kubectl", kubeconfig)
    admin("apply", "--server-side", "--force-conflicts", "-f", str(CRDS))
    admin("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    return admin


@pytest.fixture
def namespace(kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace for one test, deleted (without waiting) afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    kubectl("create", "namespace", name)
    # Pods need the default ServiceAccount, which the controller-manager creates asynchronously.
    wait_until(
        lambda: kubectl.run("-n", name, "get", "serviceaccount", "default").returncode == 0,
        timeout=30,
        what=f"the default ServiceAccount in {name}",
    )
    yield name
    kubectl("delete", "namespace", name, "--wait=false")


@pytest.fixture
def kube(kubectl: Kubectl, namespace: str) -> Kubectl:
    """kubectl bound to the test's own namespace."""
    return kubectl.in_namespace(namespace)
