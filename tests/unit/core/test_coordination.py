"""coordination.k8s.io Leases as plain data: the spec each holder writes, and when a holder counts as gone."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.coordination import (
    DEFAULT_DURATION_SECONDS,
    LastChange,
    duration_of,
    first_hold,
    handed_back,
    holder_of,
    may_take,
    renewal,
    taken,
)

NOW = 1795953600.25  # 2026-11-29T12:00:00.250000Z
STAMP = "2026-11-29T12:00:00.250000Z"


def lease(holder: str | None, version: str = "1", **spec: Any) -> dict[str, Any]:
    if holder is not None:
        spec["holderIdentity"] = holder
    return {"metadata": {"name": "sandfleet-operator", "resourceVersion": version}, "spec": spec}


def test_the_fields_a_holder_writes_are_the_wire_format() -> None:
    # Replicas of different versions share these Leases: the names and types must not change.
    assert renewal("op-1", 15.9, NOW) == {
        "holderIdentity": "op-1",
        "leaseDurationSeconds": 15,
        "renewTime": STAMP,
    }
    assert first_hold("op-1", 15.0, NOW) == {
        "holderIdentity": "op-1",
        "leaseDurationSeconds": 15,
        "acquireTime": STAMP,
        "renewTime": STAMP,
        "leaseTransitions": 0,
    }


def test_a_renewal_keeps_the_acquire_time_and_a_takeover_counts_a_transition() -> None:
    current = {
        "holderIdentity": "op-1",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-01-01T00:00:00.000000Z",
        "renewTime": "2026-01-01T00:00:10.000000Z",
        "leaseTransitions": 3,
    }
    renewed = taken(current, "op-1", 15.0, NOW)
    assert renewed == {**current, "renewTime": STAMP}
    took = taken(current, "op-2", 9.0, NOW)
    assert took == {
        "holderIdentity": "op-2",
        "leaseDurationSeconds": 9,
        "acquireTime": STAMP,
        "renewTime": STAMP,
        "leaseTransitions": 4,
    }
    # A released Lease (no holder) or one written by another tool (no transitions yet) is taken alike.
    assert taken({"holderIdentity": ""}, "op-2", 15.0, NOW)["leaseTransitions"] == 1
    assert taken({}, "op-2", 15.0, NOW)["acquireTime"] == STAMP


def test_handing_back_leaves_it_unheld_for_a_second_and_the_rest_as_it_was() -> None:
    current = {"holderIdentity": "op-1", "leaseDurationSeconds": 15, "leaseTransitions": 2}
    assert handed_back(current) == {"holderIdentity": "", "leaseDurationSeconds": 1, "leaseTransitions": 2}


def test_holder_and_duration_read_with_their_defaults() -> None:
    assert holder_of(lease("op-1")) == "op-1"
    assert holder_of(lease(None)) == holder_of({"metadata": {}}) == ""
    assert duration_of({"leaseDurationSeconds": 7}) == 7.0
    assert duration_of({}) == duration_of({"leaseDurationSeconds": None}) == DEFAULT_DURATION_SECONDS


@given(
    st.sampled_from(["", "me", "other"]),
    st.floats(min_value=0, max_value=100),
    st.floats(min_value=1, max_value=60),
)
def test_a_lease_is_taken_only_when_unheld_ours_or_its_holder_is_silent_a_whole_duration(
    holder: str, silent: float, duration: float
) -> None:
    allowed = may_take(holder, "me", silent, duration)
    if holder in ("", "me"):
        assert allowed
    else:
        assert allowed == (silent > duration)


def test_silence_counts_from_the_last_change_seen_by_our_own_clock() -> None:
    change = LastChange()
    # First sight: silent for nothing yet, whatever its renewTime says (another replica's clock).
    assert change.silent_for(lease("op-1", "5", renewTime="1970-01-01T00:00:00Z"), now=100.0) == 0.0
    assert change.silent_for(lease("op-1", "5"), now=116.0) == 16.0
    # A renewal (a new resourceVersion) or a new holder starts the count again.
    assert change.silent_for(lease("op-1", "6"), now=120.0) == 0.0
    assert change.silent_for(lease("op-1", "6"), now=121.5) == 1.5
    assert change.silent_for(lease("op-2", "6"), now=130.0) == 0.0
