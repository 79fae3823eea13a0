"""The warm index hands sandboxes out in exactly pick_warm's order, whatever changed before; lease keys."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from sandfleet.core import api
from sandfleet.core.lease_keys import LeaseKeys
from sandfleet.core.leases import LeaseRecord
from sandfleet.core.model import SandboxPod
from sandfleet.core.partition import owner
from sandfleet.core.warm_index import Mine, WarmIndex, WarmShelves, pick_warm

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


@dataclass(frozen=True)
class Prefer:
    """The gateway replicas changed: `members` share the warm sandboxes, and we are the first."""

    members: tuple[str, ...]

    def mine(self) -> Mine | None:
        if not self.members:
            return None
        members, me = self.members, self.members[0]
        return lambda s: owner(s.name, members) == me


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
        st.builds(Prefer, st.lists(st.sampled_from(["gw-a", "gw-b", "gw-c"]), unique=True).map(tuple)),
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
def test_matches_pick_warm_on_any_sequence_of_changes(ops: list[Put | Discard | Prefer | Take]) -> None:
    """A model (a dict of current sandboxes, sorted by pick_warm) agrees with the index at every step,
    whatever the gateway replicas sharing them did in between."""
    index = WarmIndex()
    model: dict[str, SandboxPod] = {}
    mine: Mine | None = None
    for version, op in enumerate(ops):
        if isinstance(op, Put):
            s = sandbox(op.name, op.region, op.created, version, state=op.state, ready=op.ready)
            model[s.key] = s
            index.put(s)
        elif isinstance(op, Discard):
            model.pop(f"ns.{op.name}", None)
            index.discard(f"ns.{op.name}")
        elif isinstance(op, Prefer):
            mine = op.mine()
            index.prefer(mine)
        else:
            expected = pick_warm(model.values(), op.regions, op.skipped, mine)[: op.count]
            skipped = op.skipped
            taken = index.take(op.count, op.regions, lambda s: s.key in skipped)  # noqa: B023
            assert taken == expected
            for s in taken:
                del model[s.key]
        assert sorted(s.key for s in index.sandboxes()) == sorted(k for k, s in model.items() if s.warm)
    assert index.take(100) == pick_warm(model.values(), (), mine=mine)
    assert len(index) == 0


def test_replicas_sharing_the_warm_sandboxes_take_disjoint_ones_first() -> None:
    """Three replicas seeing the same 300 warm sandboxes: their first 60 each never overlap, and
    once a replica's own share is gone it goes on with the others' (a preference, not a lock)."""
    members = ("gw-a", "gw-b", "gw-c")
    warm = [sandbox(f"s{i:03}", created=float(i)) for i in range(300)]
    taken: dict[str, list[str]] = {}
    for me in members:
        shelves = WarmShelves()
        shelves.prefer(lambda s, me=me: owner(s.name, members) == me)  # type: ignore[misc]
        for s in warm:
            shelves.update(s)
        taken[me] = [s.name for s in shelves.shelf("python", "img").take(300)]
    firsts = [set(names[:60]) for names in taken.values()]
    for i, j in ((0, 1), (0, 2), (1, 2)):
        assert not firsts[i] & firsts[j]
    assert all(len(names) == 300 for names in taken.values())
    shares = [sum(owner(n, members) == me for n in taken[me]) for me in members]
    assert all(70 <= share <= 130 for share in shares), shares  # about a third each
    for me in members:
        own = [owner(n, members) == me for n in taken[me]]
        assert own == sorted(own, reverse=True), "a replica's own share comes first, then the rest"


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
