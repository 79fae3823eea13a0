"""The pool fill benchmark runs in its short mode (CI size) and reports what it measured.

The scale run's short mode (operator_scale) runs through bench/run, in
tests/integration/gateway/test_bench_runner.py: once per CI run, not twice.
"""

from __future__ import annotations

import pytest

from tests.support.bench import run_short
from tests.support.kube import Kubectl

pytestmark = pytest.mark.cluster


def test_pool_fill_short(kubectl: Kubectl) -> None:
    report = run_short("pool_fill.py")
    assert report["benchmark"] == "pool_fill"
    assert report["sandboxes"] == 150
    assert report["pool_sandboxes_per_second"] > 0
    assert report["replicaset_pods_per_second"] > 0
    assert report["ratio_to_replicaset"] == pytest.approx(
        report["pool_sandboxes_per_second"] / report["replicaset_pods_per_second"], rel=0.01
    )
