"""The simulated nodes: 3 regions x 2 zones with different capacity per region, and a few GPU nodes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SIMULATED_LABEL = "sandfleet.dev/simulated"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT_KEY = "nvidia.com/gpu"


@dataclass(frozen=True)
class RegionShape:
    """What one node in a region looks like; regions differ on purpose so capacity matters."""

    name: str
    zones: tuple[str, str]
    cpu: int
    memory_gi: int
    pods: int
    instance_type: str


REGIONS = (
    RegionShape("us-east1", ("us-east1-b", "us-east1-c"), 32, 128, 110, "n2-standard-32"),
    RegionShape("europe-west4", ("europe-west4-a", "europe-west4-b"), 16, 64, 110, "n2-standard-16"),
    RegionShape("asia-southeast1", ("asia-southeast1-a", "asia-southeast1-b"), 8, 32, 64, "n2-standard-8"),
)
# GPU nodes exist in two of the three regions, as in most real fleets.
GPU_REGIONS = ("us-east1", "europe-west4")
GPUS_PER_NODE = 8


def _node(name: str, region: RegionShape, zone: str, gpus: int) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": region.instance_type,
        "topology.kubernetes.io/region": region.name,
        "topology.kubernetes.io/zone": zone,
        "type": "kwok",
        SIMULATED_LABEL: "true",
    }
    allocatable = {
        "cpu": str(region.cpu),
        "memory": f"{region.memory_gi}Gi",
        "pods": str(region.pods),
        "ephemeral-storage": "200Gi",
    }
    spec: dict[str, Any] = {}
    if gpus:
        labels["nvidia.com/gpu.present"] = "true"
        labels["node.kubernetes.io/instance-type"] = "a3-highgpu-8g"
        allocatable[GPU_RESOURCE] = str(gpus)
        spec["taints"] = [{"key": GPU_TAINT_KEY, "value": "present", "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": spec,
        "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
    }


def simulated_nodes(count: int, gpu_count: int) -> list[dict[str, Any]]:
    """`count` CPU nodes round-robin over every (region, zone), plus `gpu_count` GPU nodes.

    `count` 0 means no simulated CPU nodes at all (a cluster around one real node).
    """
    if 0 < count < len(REGIONS) * 2:
        raise ValueError(f"--nodes must be 0 or at least {len(REGIONS) * 2} (one per region and zone)")
    if count < 0:
        raise ValueError("--nodes must not be negative")
    if gpu_count < 0:
        raise ValueError("--gpu-nodes must not be negative")
    slots = [(region, zone) for region in REGIONS for zone in region.zones]
    nodes = []
    for index in range(count):
        region, zone = slots[index % len(slots)]
        nodes.append(_node(f"kwok-{zone}-{index // len(slots):03d}", region, zone, gpus=0))
    by_name = {r.name: r for r in REGIONS}
    for index in range(gpu_count):
        region = by_name[GPU_REGIONS[index % len(GPU_REGIONS)]]
        zone = region.zones[(index // len(GPU_REGIONS)) % 2]
        name = f"kwok-gpu-{zone}-{index // len(GPU_REGIONS):03d}"
        nodes.append(_node(name, region, zone, gpus=GPUS_PER_NODE))
    return nodes
