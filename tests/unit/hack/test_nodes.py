"""The simulated node topology: regions, zones, capacities and GPU nodes."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localcluster.nodes import GPU_REGIONS, GPU_RESOURCE, REGIONS, simulated_nodes

REGION = "topology.kubernetes.io/region"
ZONE = "topology.kubernetes.io/zone"


@given(count=st.integers(min_value=6, max_value=400), gpus=st.integers(min_value=0, max_value=12))
def test_nodes_are_spread_evenly_and_named_uniquely(count: int, gpus: int) -> None:
    nodes = simulated_nodes(count, gpus)
    assert len(nodes) == count + gpus
    assert len({n["metadata"]["name"] for n in nodes}) == len(nodes)
    cpu_nodes = [n for n in nodes if GPU_RESOURCE not in n["status"]["allocatable"]]
    per_zone = Counter(n["metadata"]["labels"][ZONE] for n in cpu_nodes)
    assert len(per_zone) == 6
    assert max(per_zone.values()) - min(per_zone.values()) <= 1
    gpu_nodes = [n for n in nodes if GPU_RESOURCE in n["status"]["allocatable"]]
    assert {n["metadata"]["labels"][REGION] for n in gpu_nodes} <= set(GPU_REGIONS)
    assert all(n["spec"]["taints"][0]["key"] == "nvidia.com/gpu" for n in gpu_nodes)
    assert all(n["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake" for n in nodes)


def test_regions_differ_in_capacity() -> None:
    assert len({(r.cpu, r.memory_gi) for r in REGIONS}) == len(REGIONS)


def test_too_few_nodes_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="--nodes must be 0 or at least 6"):
        simulated_nodes(3, 0)


def test_no_simulated_nodes_is_allowed() -> None:
    assert simulated_nodes(0, 0) == []
    assert len(simulated_nodes(0, 2)) == 2
