"""Plain-data builders and hypothesis strategies for the planner and placement tests."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

from hypothesis import strategies as st

from sandfleet.core import api
from sandfleet.core.leases import LeaseRecord
from sandfleet.core.model import Node, PoolSpec, RegionSpec, SandboxPod, Template
from sandfleet.core.placement import RegionCapacity
from sandfleet.core.planner import FailureState, PoolPlan, WarmGroup, plan_pool
from sandfleet.core.resources import Resources

TEMPLATE = Template(image="sandfleet/sandbox:0.1.0", readiness_deadline_seconds=60)
REGIONS = ("us", "eu", "asia")
_names = itertools.count()


def pool(
    replicas: int, regions: Sequence[RegionSpec] | None = None, template: Template = TEMPLATE
) -> PoolSpec:
    return PoolSpec(
        namespace="ns",
        name="p",
        uid="uid",
        generation=1,
        replicas=replicas,
        regions=tuple(regions or (RegionSpec(r) for r in REGIONS)),
        template=template,
    )


def sandbox(
    region: str,
    *,
    state: str = api.LEASE_FREE,
    ready: bool = True,
    lease_expires_at: float | None = None,
    **kw: object,
) -> SandboxPod:
    name = f"sb-{next(_names)}"
    defaults: dict[str, object] = {
        "namespace": "ns",
        "name": name,
        "pool": "p",
        "region": region,
        "zone": f"{region}-a",
        "template_hash": TEMPLATE.hash,
        "state": state,
        "created_at": 0.0,
        "ready": ready,
        "node": f"node-{region}",
    }
    if lease_expires_at is not None:  # the expiry is the lease record's
        defaults["lease"] = LeaseRecord(f"ns.{name}", "p", "actor", 0.0, lease_expires_at, 60)
    defaults.update(kw)
    return SandboxPod(**defaults)  # type: ignore[arg-type]


def roomy(slots: int = 1000) -> dict[str, RegionCapacity]:
    return {
        r: RegionCapacity(zones={f"{r}-a": slots, f"{r}-b": slots}, ready_nodes=2, nodes=2) for r in REGIONS
    }


def run(
    p: PoolSpec,
    sandboxes: Sequence[SandboxPod],
    capacity: dict[str, RegionCapacity] | None = None,
    now: float = 100.0,
    failures: FailureState | None = None,
    nodes_ready: dict[str, bool] | None = None,
) -> PoolPlan:
    return plan_pool(
        p,
        [WarmGroup(p.template, p.replicas)],
        sandboxes,
        capacity if capacity is not None else roomy(),
        nodes_ready or {},
        failures or FailureState(),
        now,
    )


region_specs = st.lists(
    st.builds(
        RegionSpec,
        name=st.sampled_from(REGIONS),
        weight=st.integers(1, 5),
        min_warm=st.integers(0, 3),
        max_sandboxes=st.integers(0, 40),
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda r: r.name,
)
states = st.sampled_from([api.LEASE_FREE, api.LEASE_FREE, api.LEASE_LEASED, api.LEASE_RELEASED])
observed = st.lists(
    st.builds(
        sandbox,
        st.sampled_from(REGIONS),
        state=states,
        ready=st.booleans(),
        created_at=st.floats(0, 200),
        lease_expires_at=st.one_of(st.none(), st.floats(0, 300)),
        template_hash=st.sampled_from([TEMPLATE.hash, "oldhash"]),
    ),
    max_size=40,
)


def _two_zones(region: str) -> st.SearchStrategy[RegionCapacity]:
    return st.builds(
        lambda a, b: RegionCapacity(zones={f"{region}-a": a, f"{region}-b": b}),
        st.integers(0, 20),
        st.integers(0, 20),
    )


capacities = st.fixed_dictionaries({r: _two_zones(r) for r in REGIONS})


def valid_regions(regions: list[RegionSpec], replicas: int) -> list[RegionSpec]:
    return [replace(r, min_warm=min(r.min_warm, r.max_sandboxes)) for r in regions]


PLACEMENT_TEMPLATE = Template(image="img:1", resources={"requests": {"cpu": "1", "memory": "1Gi"}})


def node(name: str, region: str, zone: str, cpu: int = 8, **kw: object) -> Node:
    defaults: dict[str, object] = {
        "name": name,
        "region": region,
        "zone": zone,
        "ready": True,
        "schedulable": True,
        "allocatable": Resources(cpu * 1000, 64 * 2**30, 110),
    }
    defaults.update(kw)
    return Node(**defaults)  # type: ignore[arg-type]
