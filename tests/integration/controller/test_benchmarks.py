"""The operator benchmarks run in their short mode (CI size) and report what they measured."""

from __future__ import annotations

import pytest

from tests.support.bench import run_short
from tests.support.kube import Kubectl

pytestmark = pytest.mark.cluster


def test_pool_fill_short(kubectl: Kubectl) -> None:
    report = run_short("pool_fill.py")
    assert report["benchmark"] == "pool_fill"
    assert report["sandboxes"] == 300
    assert report["pool_sandboxes_per_second"] > 0
    assert report["replicaset_pods_per_second"] > 0
    assert report["ratio_to_replicaset"] == pytest.approx(
        report["pool_sandboxes_per_second"] / report["replicaset_pods_per_second"], rel=0.01
    )


def test_operator_scale_short(kubectl: Kubectl) -> None:
    report = run_short("operator_scale.py")
    assert report["benchmark"] == "operator_scale"
    assert report["sandboxes"] == 400
    assert 0 < report["operator_rss_mb"] <= report["operator_rss_peak_mb"]
    assert report["operator_cpu_cores_steady"] >= 0
