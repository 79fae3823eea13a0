"""The lease ledger's pure part: entries and their JSON, what each operation decides, and the Pod overlay."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from sandfleet.core import api
from sandfleet.core.leases import LeaseRecord
from sandfleet.core.ledger import (
    FREE,
    TOMBSTONE_SECONDS,
    UNREADABLE,
    Claim,
    LedgerEntry,
    Release,
    Reserve,
    Retire,
    Rewrite,
    Unclaim,
    changed_pods,
    decide,
    decode_entries,
    encode_entries,
    entry_from_json,
    entry_to_json,
    is_tombstone,
    ledger_from_object,
    ledger_name,
    ledger_object,
    ledger_patch,
    overlay,
    pool_shards,
    read_entries,
    shard_for,
)
from sandfleet.core.model import SandboxPod


def lease(
    pod: str = "p-1", holder: str = "alice", run: str | None = "r1", at: float = 100.0, **kw: object
) -> LeaseRecord:
    labels = {"run": run} if run else {}
    fields: dict[str, object] = {
        "id": f"ns.{pod}",
        "pool": "python",
        "holder": holder,
        "acquired_at": at,
        "expires_at": at + 60,
        "ttl_seconds": 60,
        "labels": labels,
    }
    fields.update(kw)
    return LeaseRecord(**fields)  # type: ignore[arg-type]


def test_a_pod_without_an_entry_is_free_and_a_claim_on_its_revision_leases_it() -> None:
    first = lease()
    decision = decide({}, [Claim("p-1", 0, first)], now=100.0)
    entry = decision.results[0]
    assert entry is not None
    assert (entry.state, entry.rev, entry.lease) == (api.LEASE_LEASED, 1, first)
    assert decision.changes == {"p-1": entry}


def test_a_claim_decided_on_an_older_revision_is_refused_and_changes_nothing() -> None:
    held = decide({}, [Claim("p-1", 0, lease(holder="alice"))], 100.0).results[0]
    assert held is not None
    late = decide({"p-1": held}, [Claim("p-1", 0, lease(holder="bob"))], 101.0)
    assert late.results == (None,)
    assert late.changes == {}


def test_two_claims_of_one_pod_in_one_batch_the_first_wins() -> None:
    decision = decide({}, [Claim("p-1", 0, lease(holder="a")), Claim("p-1", 0, lease(holder="b"))], 100.0)
    winner, loser = decision.results
    assert winner is not None
    assert winner.lease is not None
    assert winner.lease.holder == "a"
    assert loser is None


def test_an_operation_whose_effect_is_already_there_succeeds_without_a_write() -> None:
    # Its write committed but the answer was lost (a timeout): the retry finds its own lease.
    claim = Claim("p-1", 0, lease())
    held = decide({}, [claim], 100.0).results[0]
    assert held is not None
    again = decide({"p-1": held}, [claim], 105.0)
    assert again.results == (held,)
    assert again.changes == {}


def test_a_renewal_needs_the_revision_it_read_and_the_same_lease() -> None:
    held = decide({}, [Claim("p-1", 0, lease())], 100.0).results[0]
    assert held is not None
    assert held.lease is not None
    renewed = held.lease.renewed(130.0, 60)
    ok = decide({"p-1": held}, [Rewrite("p-1", held.rev, renewed)], 130.0).results[0]
    assert ok is not None
    assert ok.lease == renewed
    assert ok.rev == held.rev + 1
    assert decide({"p-1": ok}, [Rewrite("p-1", held.rev, renewed.renewed(140.0, 60))], 140.0).results == (
        None,
    )
    other = replace(renewed, id="ns.p-1~1")
    assert decide({"p-1": ok}, [Rewrite("p-1", ok.rev, other)], 140.0).results == (None,)


def test_an_unclaim_loses_to_a_retry_that_adopted_the_lease_first() -> None:
    held = decide({}, [Claim("p-1", 0, lease())], 100.0).results[0]
    assert held is not None
    assert held.lease is not None
    adopted = decide({"p-1": held}, [Rewrite("p-1", held.rev, replace(held.lease, attempt="retry"))], 101.0)
    now_held = adopted.results[0]
    assert now_held is not None
    assert decide({"p-1": now_held}, [Unclaim("p-1", held.rev)], 102.0).results == (None,)
    back = decide({"p-1": held}, [Unclaim("p-1", held.rev)], 102.0).results[0]
    assert back is not None
    assert (back.state, back.lease) == (api.LEASE_FREE, None)


def test_a_recycled_sandbox_nobody_received_goes_back_to_its_run() -> None:
    reserved = LedgerEntry(api.LEASE_RESERVED, 4, 2, None, ("alice", "r1"), 90.0, 90.0)
    claim = Claim("p-1", 4, lease(id="ns.p-1~2"))
    held = decide({"p-1": reserved}, [claim], 100.0).results[0]
    assert held is not None
    assert held.episodes == 2
    back = decide({"p-1": held}, [Unclaim("p-1", held.rev)], 101.0).results[0]
    assert back is not None
    assert (back.state, back.reserved_for, back.episodes) == (api.LEASE_RESERVED, ("alice", "r1"), 2)


def test_a_reserved_sandbox_is_claimed_only_by_its_holder_and_run() -> None:
    reserved = LedgerEntry(api.LEASE_RESERVED, 4, 2, None, ("alice", "r1"), 90.0, 90.0)
    for other in (lease(holder="bob"), lease(run="r2"), lease(run=None)):
        assert decide({"p-1": reserved}, [Claim("p-1", 4, other)], 100.0).results == (None,)


def test_release_names_the_lease_not_the_revision_and_is_refused_once_ended() -> None:
    held = decide({}, [Claim("p-1", 0, lease())], 100.0).results[0]
    assert held is not None
    assert held.lease is not None
    renewed = decide({"p-1": held}, [Rewrite("p-1", held.rev, held.lease.renewed(120.0, 60))], 120.0).results[
        0
    ]
    assert renewed is not None
    released = decide({"p-1": renewed}, [Release("p-1", "ns.p-1")], 130.0).results[0]
    assert released is not None
    assert released.state == api.LEASE_RELEASED
    assert decide({"p-1": released}, [Release("p-1", "ns.p-1")], 131.0).results == (None,)
    assert decide({"p-1": renewed}, [Release("p-1", "ns.p-1~1")], 131.0).results == (None,)


def test_reserve_ends_the_lease_and_keeps_the_sandbox_for_the_run() -> None:
    held = decide({}, [Claim("p-1", 0, lease())], 100.0).results[0]
    assert held is not None
    kept = decide({"p-1": held}, [Reserve("p-1", "ns.p-1", "alice", "r1", 1)], 130.0).results[0]
    assert kept is not None
    assert (kept.state, kept.episodes, kept.lease, kept.reserved_for) == (
        api.LEASE_RESERVED,
        1,
        None,
        ("alice", "r1"),
    )
    assert kept.reserved_since == 130.0
    # A second replica releasing the same lease finds it reserved already: nothing more to do.
    again = decide({"p-1": kept}, [Reserve("p-1", "ns.p-1", "alice", "r1", 1)], 131.0)
    assert again.results == (kept,)
    assert again.changes == {}
    released = decide({"p-1": held}, [Release("p-1", "ns.p-1")], 130.0).results[0]
    assert released is not None
    assert decide({"p-1": released}, [Reserve("p-1", "ns.p-1", "alice", "r1", 1)], 131.0).results == (None,)


def test_retire_wins_only_on_the_entry_it_was_decided_on_and_then_nothing_leases_it() -> None:
    held = decide({}, [Claim("p-1", 0, lease())], 100.0).results[0]
    assert held is not None
    assert decide({"p-1": held}, [Retire("p-1", 0)], 200.0).results == (None,)  # leased meanwhile
    retired = decide({}, [Retire("p-1", 0)], 200.0).results[0]
    assert retired is not None
    assert retired.state == api.LEASE_RETIRED
    assert decide({"p-1": retired}, [Claim("p-1", retired.rev, lease())], 201.0).results == (None,)


def test_a_full_ledger_refuses_new_entries_but_not_changes_to_its_own() -> None:
    held = {f"p-{i}": LedgerEntry(api.LEASE_LEASED, 1, lease=lease(pod=f"p-{i}")) for i in range(3)}
    decision = decide(
        held, [Claim("p-9", 0, lease(pod="p-9")), Release("p-0", "ns.p-0")], 100.0, max_entries=3
    )
    refused, released = decision.results
    assert refused is None
    assert released is not None


def test_a_gone_pods_entry_is_held_retired_until_the_tombstone_ends_then_dropped() -> None:
    """A writer whose Pod watch lags must find a deleted Pod held, never free (the entry-less reading)."""
    held = {
        "p-1": LedgerEntry(api.LEASE_RELEASED, 2, lease=lease(pod="p-1")),
        "p-2": LedgerEntry(api.LEASE_LEASED, 1, lease=lease(pod="p-2")),
        "p-3": LedgerEntry(api.LEASE_RETIRED, 7, changed_at=90.0),  # retired when it was free
        "p-4": LedgerEntry(api.LEASE_FREE, 3),
        "p-5": LedgerEntry(api.LEASE_RESERVED, 4, episodes=2, reserved_for=("alice", "run-1")),
        "p-6": LedgerEntry(api.LEASE_LEASED, 5, lease=lease(pod="p-6")),  # its node went with it
    }
    gone = {pod: 100.0 for pod in ("p-1", "p-3", "p-4", "p-5", "p-6", "p-7")}
    now = 100.0 + TOMBSTONE_SECONDS - 1
    soon = decide(held, [Claim("p-8", 0, lease(pod="p-8"))], now, gone=gone)
    assert soon.results[0] is not None
    assert set(soon.changes) == {"p-1", "p-4", "p-5", "p-6", "p-8"}  # p-2 lives, p-3 is one, no p-7
    for pod in ("p-1", "p-4", "p-5", "p-6"):
        kept = soon.changes[pod]
        assert kept == LedgerEntry(api.LEASE_RETIRED, held[pod].rev + 1, held[pod].episodes, changed_at=now)
        assert is_tombstone(kept)
    # A claim decided on the Pod as free (entry-less, or its old entry) is refused meanwhile.
    after = {**held, **{pod: entry for pod, entry in soon.changes.items() if entry is not None}}
    lagging = [
        Claim("p-1", 0, lease(pod="p-1")),
        Claim("p-3", 0, lease(pod="p-3")),
        Claim("p-4", 3, lease(pod="p-4")),
        Claim("p-4", 0, lease(pod="p-4")),
    ]
    assert decide(after, lagging, now, gone=gone).results == (None,) * 4
    late = decide(after, [], 100.0 + TOMBSTONE_SECONDS, gone=gone)
    assert late.changes == {pod: None for pod in ("p-1", "p-3", "p-4", "p-5", "p-6")}


@st.composite
def entries(draw: st.DrawFn) -> LedgerEntry:
    state = draw(
        st.sampled_from(
            [api.LEASE_FREE, api.LEASE_LEASED, api.LEASE_RELEASED, api.LEASE_RESERVED, api.LEASE_RETIRED]
        )
    )
    leased = state in (api.LEASE_LEASED, api.LEASE_RELEASED)
    text = st.text(min_size=1, max_size=12)
    return LedgerEntry(
        state=state,
        rev=draw(st.integers(0, 10**6)),
        episodes=draw(st.integers(0, 50)),
        lease=lease(holder=draw(text), run=draw(st.one_of(st.none(), text)), at=draw(st.floats(0, 2e9)))
        if leased
        else None,
        reserved_for=(draw(text), draw(text)) if state == api.LEASE_RESERVED else None,
        reserved_since=draw(st.floats(0, 2e9)) if state == api.LEASE_RESERVED else None,
        changed_at=draw(st.floats(0, 2e9)),
    )


@given(entries())
def test_an_entry_reads_back_as_written(entry: LedgerEntry) -> None:
    assert entry_from_json(entry_to_json(entry)) == entry


def test_unreadable_entries_count_as_held_never_free() -> None:
    read, changed = read_entries({"p-1": "{not json", "p-2": "[7]", "p-3": entry_to_json(FREE)})
    assert read["p-1"] == UNREADABLE
    assert read["p-2"] == UNREADABLE
    assert read["p-3"] == FREE
    assert changed == {"p-1", "p-2", "p-3"}
    assert decide(read, [Claim("p-1", 0, lease()), Claim("p-1", -1, lease())], 1.0).results == (None, None)


def test_reading_again_parses_only_what_changed() -> None:
    raw = {"p-1": entry_to_json(FREE), "p-2": entry_to_json(LedgerEntry(api.LEASE_LEASED, 1, lease=lease()))}
    first, _ = read_entries(raw)
    moved = {**raw, "p-1": entry_to_json(LedgerEntry(api.LEASE_RETIRED, 1))}
    del moved["p-2"]
    second, changed = read_entries(moved, raw, first)
    assert changed == {"p-1", "p-2"}
    assert second["p-1"].state == api.LEASE_RETIRED
    assert changed_pods(first, second) == {"p-1", "p-2"}


def test_the_ledger_object_and_its_patch() -> None:
    held = LedgerEntry(api.LEASE_LEASED, 1, lease=lease())
    obj = ledger_object("ns", "07", {"p-1": held, "p-3": LedgerEntry(api.LEASE_RELEASED, 2, lease=lease())})
    assert obj["metadata"]["name"] == ledger_name("07") == "sandfleet-ledger-07"
    assert (obj["spec"]["count"], obj["spec"]["leased"]) == (2, 1)  # for kubectl get sandboxledgers
    read = ledger_from_object({**obj, "metadata": {**obj["metadata"], "resourceVersion": "42"}})
    assert (read.shard, read.resource_version, read.entry("p-1"), read.entry("p-2")) == (
        "07",
        "42",
        held,
        FREE,
    )
    patch = ledger_patch("42", "07", {"p-2": held})
    assert patch["metadata"] == {"resourceVersion": "42"}
    assert decode_entries(patch["spec"]["entries"]) == {"p-2": entry_to_json(held)}


POD_NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1, max_size=63)
ONE_LINE = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Zl", "Zp", "Cs")), max_size=80)


@given(st.dictionaries(POD_NAMES, ONE_LINE))
def test_stored_entries_read_back_exactly(raw: dict[str, str]) -> None:
    blob = encode_entries(raw)
    assert decode_entries(blob) == raw
    assert encode_entries(raw) == blob  # deterministic: the same entries are the same bytes


def test_a_blob_that_cannot_be_read_is_none_never_empty() -> None:
    assert decode_entries("") == {}
    for damaged in ("not base64!", "aGVsbG8=", 7, None):
        assert decode_entries(damaged) is None


def test_lease_entries_compress_well() -> None:
    """Why the entries are one compressed string: the apiserver's cost of a write follows its bytes."""
    raw = {}
    for i in range(1000):
        pod = f"python-{i:08x}"
        record = lease(
            pod=pod,
            holder="system:serviceaccount:rl:actor",
            at=1.8e9 + i * 0.37,
            idempotency_key=f"step-{i // 64}-{i}",
            attempt=f"{i * 7919:032x}",
            request=f"{i // 64:016x}",
        )
        raw[pod] = entry_to_json(LedgerEntry(api.LEASE_LEASED, i % 7, lease=record))
    plain = sum(len(pod) + len(value) + 2 for pod, value in raw.items())
    assert len(encode_entries(raw)) < plain / 4


def test_a_large_pools_pods_spread_over_every_shard_stably() -> None:
    names = [f"python-{i:05x}" for i in range(3_200)]
    shards = [shard_for(name, "python", 10_000, 16) for name in names]
    assert shards == [shard_for(name, "python", 10_000, 16) for name in names]
    assert set(shards) == {f"{i:02d}" for i in range(16)}
    assert max(shards.count(s) for s in set(shards)) < 2 * len(names) / 16


def test_a_pool_takes_one_shard_per_128_sandboxes_consecutive_from_its_own_start() -> None:
    assert [pool_shards(n) for n in (0, 1, 128, 129, 300, 3_072, 10_000)] == [1, 1, 1, 2, 3, 24, 24]
    small = {shard_for(f"sb-{i}", "python", 100) for i in range(200)}
    assert len(small) == 1  # a batch of a small pool is one ledger write
    three = sorted(int(s) for s in {shard_for(f"sb-{i}", "python", 300) for i in range(300)})
    assert len(three) == 3
    assert {(three[0] + k) % 24 for k in range(3)} == set(three)  # consecutive (round the 24)
    starts = {shard_for("sb-0", f"pool-{i}", 100) for i in range(50)}
    assert len(starts) > 10  # other pools of the namespace start elsewhere


def test_a_ledger_pod_reads_its_lease_state_from_its_entry() -> None:
    pod = SandboxPod(
        "ns",
        "p-1",
        "python",
        "us-east1",
        resource_version="900",
        state=api.LEASE_IN_LEDGER,
        ready=True,
        shard="03",
    )
    assert not pod.warm  # without its ledger, a ledger Pod is never handed out
    free = overlay(pod, None)
    assert free.warm
    assert free.version == "900/0"
    held = overlay(pod, LedgerEntry(api.LEASE_LEASED, 5, lease=lease()))
    assert (held.leased, held.lease, held.entry_rev, held.version) == (True, lease(), 5, "900/5")


# -- two writers over a conditional store: never a double lease ----------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from("ab"),
            st.sampled_from(["claim", "release", "unclaim", "retire", "read"]),
            st.integers(0, 2),
        ),
        max_size=60,
    )
)
def test_writers_with_stale_views_never_lease_a_pod_twice(steps: list[tuple[str, str, int]]) -> None:
    """Each writer decides on its own (possibly stale) copy and writes only if the store is unchanged.

    The invariant: a Pod's entry is leased to at most one lease at a time, and a lease that was
    granted is only ever ended by a release, an un-claim of that very claim, or nothing.
    """
    store: dict[str, LedgerEntry] = {}
    version = 0
    views: dict[str, tuple[dict[str, LedgerEntry], int]] = {"a": ({}, 0), "b": ({}, 0)}
    granted: dict[str, list[str]] = {}  # pod -> the lease ids granted on it, in order
    serial = 0
    for writer, action, index in steps:
        pod = f"p-{index}"
        view, seen = views[writer]
        if action == "read":
            views[writer] = (dict(store), version)
            continue
        entry = view.get(pod, FREE)
        serial += 1
        if action == "claim":
            op: Claim | Release | Unclaim | Retire = Claim(
                pod, entry.rev, lease(pod=pod, holder=writer, at=float(serial))
            )
        elif action == "release":
            if entry.lease is None:
                continue
            op = Release(pod, entry.lease.id)
        elif action == "unclaim":
            op = Unclaim(pod, entry.rev)
        else:
            op = Retire(pod, entry.rev)
        decision = decide(view, [op], float(serial))
        if seen != version:  # the conditional write fails: a 409, the view is read again
            views[writer] = (dict(store), version)
            continue
        store.update({k: v for k, v in decision.changes.items() if v is not None})
        version += 1
        views[writer] = (dict(store), version)
        result = decision.results[0]
        if isinstance(op, Claim) and result is not None and result.lease == op.lease and decision.changes:
            history = granted.setdefault(pod, [])
            assert entry.state in (api.LEASE_FREE, api.LEASE_RESERVED), "a claim landed on a held entry"
            history.append(f"{op.lease.holder}@{op.lease.acquired_at}")
    for pod, entry in store.items():
        if entry.state == api.LEASE_LEASED:
            assert entry.lease is not None
            assert granted[pod][-1] == f"{entry.lease.holder}@{entry.lease.acquired_at}"
