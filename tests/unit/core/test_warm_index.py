"""The warm index hands sandboxes out in exactly pick_warm's order, whatever changed before; lease keys."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from sandfleet.core import api
from sandfleet.core.lease_keys import LeaseKeys
from sandfleet.core.leases import LeaseRecord
from sandfleet.core.model import SandboxPod
from sandfleet.core.warm_index import WarmIndex, WarmShelves, pick_warm

REGIONS = ["us-east1", "europe-west4", "asia-southeast1", ""]


def sandbox(
    name: str, region: str = "us-east1", created: float = 0.0, version: int = 1, **kw: object
) -> SandboxPod:
    fields: dict[str, object] = {
        "namespace": "ns",
        "name": name,
        "pool": "python",
        "region": region,
        "resource_version": str(version),
        "state": api.LEASE_FREE,
        "ready": True,
        "terminating": False,
        "address": "10.0.0.1",
        "port": 8080,
        "lease": None,
        "created_at": created,
        "image_key": "img",
    }
    fields.update(kw)
    return SandboxPod(**fields)  # type: ignore[arg-type]


def test_take_prefers_regions_then_oldest_then_name() -> None:
    index = WarmIndex()
    for s in [
        sandbox("b", "us-east1", 5),
        sandbox("a", "us-east1", 5),
        sandbox("c", "europe-west4", 9),
        sandbox("d", "asia-southeast1", 1),
    ]:
        index.put(s)
    assert [s.name for s in index.take(4, ("europe-west4",))] == ["c", "d", "a", "b"]
    assert len(index) == 0


def test_skipped_sandboxes_stay_and_changes_move_them() -> None:
    index = WarmIndex()
    index.put(sandbox("old", created=1))
    index.put(sandbox("new", created=2))
    assert [s.name for s in index.take(1, skip=lambda s: s.name == "old")] == ["new"]
    assert "ns.old" in index
    index.put(sandbox("old", created=1, state=api.LEASE_LEASED))  # claimed elsewhere
    assert index.take(5) == []
    index.put(sandbox("moved", created=3))
    index.put(sandbox("moved", region="europe-west4", created=0, version=2))
    (moved,) = index.take(1)
    assert (moved.region, moved.resource_version) == ("europe-west4", "2")


def test_shelves_keep_images_apart() -> None:
    shelves = WarmShelves()
    shelves.update(sandbox("a"))
    shelves.update(sandbox("t", image_key="task"))
    assert [s.name for s in shelves.shelf("python", "task").take(5)] == ["t"]
    shelves.update(sandbox("a", ready=False))
    assert len(shelves.shelf("python", "img")) == 0


def test_dead_entries_are_compacted() -> None:
    index = WarmIndex()
    for i in range(1000):
        index.put(sandbox(f"s{i}", created=float(i)))
    for i in range(999):
        index.discard(f"ns.s{i}")
    assert index._entries <= 2 * len(index) + 64
    assert [s.name for s in index.take(2)] == ["s999"]


@dataclass(frozen=True)
class Put:
    name: str
    region: str
    created: float
    state: str
    ready: bool


@dataclass(frozen=True)
class Discard:
    name: str


@dataclass(frozen=True)
class Take:
    count: int
    regions: tuple[str, ...]
    skipped: frozenset[str]


names = st.sampled_from([f"s{i}" for i in range(12)])
operations = st.lists(
    st.one_of(
        st.builds(
            Put,
            names,
            st.sampled_from(REGIONS),
            st.integers(0, 5).map(float),
            st.sampled_from([api.LEASE_FREE, api.LEASE_FREE, api.LEASE_LEASED]),
            st.booleans(),
        ),
        st.builds(Discard, names),
        st.builds(
            Take,
            st.integers(0, 4),
            st.lists(st.sampled_from(REGIONS), max_size=3).map(tuple),
            st.frozensets(names.map(lambda n: f"ns.{n}"), max_size=4),
        ),
    ),
    max_size=60,
)


@settings(max_examples=400)
@given(operations)
def test_matches_pick_warm_on_any_sequence_of_changes(ops: list[Put | Discard | Take]) -> None:
    """A model (a dict of current sandboxes, sorted by pick_warm) agrees with the index at every step."""
    index = WarmIndex()
    model: dict[str, SandboxPod] = {}
    for version, op in enumerate(ops):
        if isinstance(op, Put):
            s = sandbox(op.name, op.region, op.created, version, state=op.state, ready=op.ready)
            model[s.key] = s
            index.put(s)
        elif isinstance(op, Discard):
            model.pop(f"ns.{op.name}", None)
            index.discard(f"ns.{op.name}")
        else:
            expected = pick_warm(model.values(), op.regions, op.skipped)[: op.count]
            skipped = op.skipped
            taken = index.take(op.count, op.regions, lambda s: s.key in skipped)  # noqa: B023
            assert taken == expected
            for s in taken:
                del model[s.key]
        assert sorted(s.key for s in index.sandboxes()) == sorted(k for k, s in model.items() if s.warm)
    assert index.take(100) == pick_warm(model.values(), ())
    assert len(index) == 0


def test_a_new_version_in_the_same_place_replaces_the_old() -> None:
    index = WarmIndex()
    first = sandbox("a", created=1, version=1)
    index.put(first)
    index.put(replace(first, resource_version="2"))
    assert [s.resource_version for s in index.take(2)] == ["2"]


def test_lease_keys_follow_the_lease_on_each_sandbox() -> None:
    keys = LeaseKeys()
    lease = LeaseRecord("ns.a", "python", "me", 0.0, 60.0, 60, idempotency_key="k")
    leased = sandbox("a", state=api.LEASE_LEASED, lease=lease)
    keys.update(leased)
    keys.update(sandbox("b", state=api.LEASE_LEASED, lease=replace(lease, id="ns.b", holder="you")))
    assert keys.find("me", "k") == [leased]
    keys.update(sandbox("a"))  # un-claimed: no lease any more
    assert keys.find("me", "k") == []
    keys.update(leased)
    keys.remove("ns.a")
    assert keys.find("me", "k") == []
    assert [s.name for s in keys.find("you", "k")] == ["b"]
    keys.clear()
    assert keys.find("you", "k") == []
