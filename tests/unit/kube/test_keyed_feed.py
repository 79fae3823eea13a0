"""The keyed feed: any run of watch events, changes missed while the watch was down, and (broken)
relists leaves a consumer holding what a model says, with a delete for exactly each key gone."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.kube.informer import SYNC
from sandfleet.kube.keyed_feed import KeyedFeed, as_is

KEYS = ("a", "b", "c", "d", "e")
LEARNED = -1  # the value of a key the consumer learned outside the watch (a write's answer, a read)


def obj(key: str, version: int, ours: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": key}, "version": version, "ours": ours}


def name(o: dict[str, Any]) -> str:
    return str(o["metadata"]["name"])


def ours_only(o: dict[str, Any]) -> dict[str, Any] | None:
    """A `read` that skips the objects not the consumer's (as the gateway's non-sandbox Pods)."""
    return o if o["ours"] else None


@dataclass
class Consumer:
    """Keyed state fed by a KeyedFeed, with a log of every call it got."""

    whole: bool  # takes a relist whole (`replace`) rather than as it goes
    # The feed skips objects not the consumer's; else it keys them all and the consumer's upsert
    # sorts them out (as ClusterCache's Pods: every Pod's key is listed, ours or not).
    skips: bool
    held: dict[str, int] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    feed: KeyedFeed[str, dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.feed = KeyedFeed(
            ours_only if self.skips else as_is,
            name,
            self.upsert,
            self.delete,
            lambda: self.held,
            self.listed,
            replace=self.replace if self.whole else None,
        )

    def upsert(self, key: str, o: dict[str, Any]) -> None:
        self.calls.append(("upsert", key))
        if o["ours"]:
            self.held[key] = o["version"]
        else:  # no longer ours: no longer held
            self.held.pop(key, None)

    def delete(self, key: str) -> None:
        self.calls.append(("delete", key))
        self.held.pop(key, None)

    def replace(self, listed: dict[str, dict[str, Any]], gone: list[str]) -> None:
        self.calls.append(("replace", ",".join(sorted(gone))))
        self.held = {key: o["version"] for key, o in listed.items() if o["ours"]}

    def listed(self) -> None:
        self.calls.append(("listed", ""))


# One step: a change the watch shows, a change it misses (it is down), a key the consumer learns
# outside the watch, or a relist (broken after `cut` objects, then made again in full).
Step = tuple[str, str, bool, int]
steps = st.lists(
    st.tuples(
        st.sampled_from(["put", "delete", "missed put", "missed delete", "learn", "relist"]),
        st.sampled_from(KEYS),
        st.booleans(),  # ours
        st.integers(min_value=0, max_value=len(KEYS) + 1),  # a relist's cut (past the end: whole)
    ),
    max_size=40,
)


def relist(consumer: Consumer, cluster: dict[str, dict[str, Any]], cut: int) -> None:
    """A (re)list as the informer makes it; checks what the consumer holds while it goes."""
    before = dict(consumer.held)
    rounds = [list(cluster.values())[:cut]] if cut < len(cluster) else []  # a list that broke
    for shown in [*rounds, list(cluster.values())]:
        consumer.feed.on_event(SYNC, {})
        for o in shown:
            consumer.feed.on_event("ADDED", o)
            if consumer.whole:
                assert consumer.held == before, "readers never see half a relist"
            elif o["ours"]:
                assert consumer.held[name(o)] == o["version"], "taken as it goes"
    consumer.feed.on_synced()


@pytest.mark.parametrize("skips", [False, True], ids=["keys all", "skips others"])
@pytest.mark.parametrize("whole", [False, True], ids=["as it goes", "whole"])
@given(run=steps)
def test_the_consumer_holds_what_the_model_says_and_hears_each_key_gone_once(
    whole: bool, skips: bool, run: list[Step]
) -> None:
    consumer = Consumer(whole, skips)
    cluster: dict[str, dict[str, Any]] = {}  # what the apiserver holds
    model: dict[str, int] = {}  # what the consumer should hold
    relist(consumer, cluster, cut=0)
    for version, (kind, key, ours, cut) in enumerate(run, start=1):
        consumer.calls.clear()
        if kind in ("put", "missed put"):
            cluster[key] = obj(key, version, ours)
            if kind == "put":
                consumer.feed.on_event("MODIFIED", cluster[key])
                if ours:
                    model[key] = version
                elif not skips:
                    model.pop(key, None)
                assert consumer.calls == ([("upsert", key)] if ours or not skips else [])
        elif kind in ("delete", "missed delete"):
            removed = cluster.pop(key, None)
            if kind == "delete" and removed is not None:
                consumer.feed.on_event("DELETED", removed)
                if removed["ours"] or not skips:
                    model.pop(key, None)
                assert consumer.calls == ([("delete", key)] if removed["ours"] or not skips else [])
        elif kind == "learn":
            consumer.held[key] = model[key] = LEARNED
        else:
            held_before = set(consumer.held)
            relist(consumer, cluster, cut)
            model = {k: o["version"] for k, o in cluster.items() if o["ours"]}
            shown = set(model) if skips else set(cluster)
            gone = sorted(held_before - shown)
            assert consumer.calls[-1] == ("listed", ""), "listed() comes last, after the deletes"
            if whole:
                assert consumer.calls == [("replace", ",".join(gone)), ("listed", "")]
            else:
                deleted = [k for call, k in consumer.calls if call == "delete"]
                assert sorted(deleted) == gone, "a delete for exactly each key the relist did not show"
                assert consumer.calls[-1 - len(deleted) : -1] == [("delete", k) for k in deleted]
        assert consumer.held == model


def test_an_object_that_no_longer_reads_is_not_listed_so_a_relist_drops_it() -> None:
    # As ClusterCache's Nodes: one that cannot be read is skipped, its key as if not listed.
    consumer = Consumer(whole=False, skips=True)
    consumer.feed.on_event(SYNC, {})
    consumer.feed.on_event("ADDED", obj("a", 1))
    consumer.feed.on_synced()
    assert consumer.held == {"a": 1}
    consumer.feed.on_event(SYNC, {})
    consumer.feed.on_event("ADDED", obj("a", 2, ours=False))
    consumer.feed.on_synced()
    assert consumer.held == {}
    assert consumer.calls[-2:] == [("delete", "a"), ("listed", "")]


def test_synced_without_a_list_deletes_nothing() -> None:
    consumer = Consumer(whole=False, skips=False)
    consumer.held["a"] = 1
    consumer.feed.on_synced()
    assert consumer.held == {"a": 1}
    assert consumer.calls == [("listed", "")]
