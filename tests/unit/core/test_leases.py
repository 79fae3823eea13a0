"""Lease arithmetic and how a lease is written on, and read back from, a Pod."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core import api
from sandfleet.core.leases import (
    LeaseError,
    LeaseRecord,
    choose_ttl,
    episodes_from_annotations,
    lease_expired,
    lease_from_annotations,
    lease_key_label,
    lease_metadata,
    release_metadata,
    reservation_from_annotations,
    reserve_metadata,
    unclaim_metadata,
)

label_text = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=0, max_size=80)


def make_lease(**overrides: object) -> LeaseRecord:
    fields: dict[str, object] = {
        "id": "l-1",
        "pool": "python",
        "holder": "actor-0",
        "acquired_at": 100.0,
        "expires_at": 160.0,
        "ttl_seconds": 60,
        "labels": {"run": "run-1", "episode": "7"},
        "policy_version": 3,
    }
    fields.update(overrides)
    return LeaseRecord(**fields)  # type: ignore[arg-type]


def test_ttl_defaults_and_bounds() -> None:
    assert choose_ttl(None, default_ttl=900, max_ttl=3600) == 900
    assert choose_ttl(60, default_ttl=900, max_ttl=3600) == 60
    with pytest.raises(LeaseError, match="above this pool's maximum of 3600"):
        choose_ttl(3601, default_ttl=900, max_ttl=3600)
    with pytest.raises(LeaseError, match="must be positive"):
        choose_ttl(0, default_ttl=900, max_ttl=3600)


def test_expiry_is_inclusive_and_renewal_moves_it() -> None:
    lease = make_lease()
    assert not lease.expired(159.9)
    assert lease.expired(160.0)
    renewed = lease.renewed(now=150.0, ttl_seconds=120)
    assert renewed.expires_at == 270.0
    assert renewed.id == lease.id


@given(run=label_text, episode=st.text(max_size=20), version=st.none() | st.integers(0, 10**6))
def test_lease_round_trips_through_pod_metadata(run: str, episode: str, version: int | None) -> None:
    lease = make_lease(labels={"run": run, "episode": episode}, policy_version=version)
    metadata = lease_metadata(lease)
    assert metadata["labels"][api.LEASE_STATE_LABEL] == api.LEASE_LEASED
    assert lease_from_annotations(metadata["annotations"]) == lease
    run_label = metadata["labels"][api.RUN_LABEL]
    # The run label is only set when it is a valid label value; otherwise it is removed.
    assert run_label in (run, None)
    if run_label is not None:
        assert 0 < len(run_label) <= 63


def test_unreadable_or_missing_lease_annotation_is_no_lease() -> None:
    assert lease_from_annotations(None) is None
    assert lease_from_annotations({}) is None
    assert lease_from_annotations({api.LEASE_ANNOTATION: "{not json"}) is None
    assert lease_from_annotations({api.LEASE_ANNOTATION: '{"id": "x"}'}) is None


def test_a_record_with_fields_of_a_newer_gateway_is_still_read_as_the_lease() -> None:
    lease = make_lease(attempt="a1")
    annotations = lease_metadata(lease)["annotations"]
    newer = {**json.loads(annotations[api.LEASE_ANNOTATION]), "shard": 3}
    assert lease_from_annotations({api.LEASE_ANNOTATION: json.dumps(newer)}) == lease
    assert lease_from_annotations({api.LEASE_ANNOTATION: "[1, 2]"}) is None
    assert lease_from_annotations({api.LEASE_ANNOTATION: '"id"'}) is None


@given(holder=st.text(max_size=40), key=st.text(min_size=1, max_size=200))
def test_a_keyed_lease_carries_a_label_safe_hash_of_its_holder_and_key(holder: str, key: str) -> None:
    label = lease_metadata(make_lease(holder=holder, idempotency_key=key))["labels"][api.LEASE_KEY_LABEL]
    assert label == lease_key_label(holder, key)
    assert len(label) == 40
    assert set(label) <= set("0123456789abcdef")
    # The holder is part of it: another tenant's retry with the same key never selects these Pods.
    assert label != lease_key_label(holder + "x", key)


def test_a_lease_without_a_key_and_a_claim_taken_back_carry_no_key_label() -> None:
    assert lease_metadata(make_lease())["labels"][api.LEASE_KEY_LABEL] is None
    assert unclaim_metadata()["labels"][api.LEASE_KEY_LABEL] is None


def test_release_marks_the_pod_released() -> None:
    assert release_metadata() == {"labels": {api.LEASE_STATE_LABEL: api.LEASE_RELEASED}}


def test_the_expiry_is_written_once_and_the_old_copy_cleared() -> None:
    annotations = lease_metadata(make_lease())["annotations"]
    assert json.loads(annotations[api.LEASE_ANNOTATION])["expires_at"] == 160.0
    # A merge patch's null removes what an older gateway wrote, so no reader sees a stale expiry.
    assert annotations[api.LEASE_EXPIRES_ANNOTATION] is None


def test_one_expiry_rule() -> None:
    assert not lease_expired(None, 1e12)
    assert not lease_expired(160.0, 159.9)
    assert lease_expired(160.0, 160.0)
    assert make_lease().expired(160.0) == lease_expired(160.0, 160.0)


def test_a_reset_pod_is_reserved_for_its_run_and_its_next_lease_takes_the_reservation_off() -> None:
    reserve = reserve_metadata("actor", "run-1", 3, 1234.5)
    assert reserve["labels"] == {api.LEASE_STATE_LABEL: api.LEASE_RESERVED, api.LEASE_KEY_LABEL: None}
    annotations = {k: v for k, v in reserve["annotations"].items() if v is not None}
    assert reserve["annotations"][api.LEASE_ANNOTATION] is None  # the ended lease goes with it
    assert reservation_from_annotations(annotations) == (("actor", "run-1"), 1234.5)
    assert episodes_from_annotations(annotations) == 3
    assert lease_metadata(make_lease())["annotations"][api.RESERVED_ANNOTATION] is None


def test_unreadable_reservations_and_episode_counts_read_as_none() -> None:
    assert reservation_from_annotations({api.RESERVED_ANNOTATION: "{"}) is None
    assert reservation_from_annotations({api.RESERVED_ANNOTATION: '{"holder": "a"}'}) is None
    assert reservation_from_annotations(None) is None
    assert episodes_from_annotations({api.EPISODES_ANNOTATION: "-1"}) == 0
    assert episodes_from_annotations({}) == 0
