"""The local runtime's pure decisions: boots on demand, prefetch caps, spin-up phases, template hashes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.limits import SandboxLimits
from sandfleet.core.pods import STARTUP_PHASES
from sandfleet.local.artifacts import REF_NAME, image_ref_from_layout
from sandfleet.local.errors import LocalRuntimeError
from sandfleet.local.plan import (
    MAX_PARALLEL_DEMAND_BOOTS,
    SPARE_IDLE_SECONDS,
    demand_boots,
    idle_spares,
    prefetch_refusal,
    startup_phases,
    template_hash,
)

counts = st.integers(min_value=0, max_value=200)


@given(waiting=counts, warm=counts, booting=st.integers(0, 20), held=counts, capacity=counts)
def test_demand_boots_cover_the_shortfall_within_capacity_and_parallelism(
    waiting: int, warm: int, booting: int, held: int, capacity: int
) -> None:
    boots = demand_boots(waiting, warm, booting, held, capacity)
    assert boots >= 0
    assert held + boots <= max(capacity, held)  # never past the runtime's capacity
    assert booting + boots <= max(MAX_PARALLEL_DEMAND_BOOTS, booting)
    assert warm + booting + boots <= max(waiting, warm + booting)  # never more than the callers need
    room = min(capacity - held, MAX_PARALLEL_DEMAND_BOOTS - booting)
    if room >= waiting - warm - booting:
        assert warm + booting + boots >= waiting  # with room, the whole group is on its way at once


def test_a_group_larger_than_the_warm_count_boots_the_difference() -> None:
    assert demand_boots(waiting=5, warm=2, booting=0, held=2, capacity=64) == 3
    assert demand_boots(waiting=5, warm=2, booting=3, held=5, capacity=64) == 0
    assert demand_boots(waiting=5, warm=2, booting=0, held=63, capacity=64) == 1


def test_prefetch_is_refused_past_the_capacity_over_all_images() -> None:
    targets = {"a": 2, "b": 2}
    assert prefetch_refusal(targets, "b", 10, leased=0, capacity=64) is None
    assert prefetch_refusal(targets, "b", 62, leased=0, capacity=64) is None  # b's own target is replaced
    refusal = prefetch_refusal(targets, "b", 62, leased=1, capacity=64)
    assert refusal is not None
    assert "at most 64" in refusal
    assert "'b'" in refusal


def test_local_timings_map_onto_the_clusters_startup_phases() -> None:
    timings = {"network_s": 0.1, "runsc_run_s": 0.4, "agent_ready_s": 0.2, "total_s": 0.7}
    phases = startup_phases(timings)
    assert tuple(phases) == STARTUP_PHASES
    assert phases["total"] == timings["total_s"]
    assert phases["scheduled"] + phases["started"] + phases["ready"] == pytest.approx(phases["total"])
    restored = startup_phases(
        {"network_s": 0.1, "runsc_restore_s": 0.3, "agent_ready_s": 0.1, "total_s": 0.5}
    )
    assert restored["started"] == 0.3


def test_the_template_hash_changes_with_the_image_and_the_limits() -> None:
    base = template_hash("sha256:a", SandboxLimits(), {})
    assert base == template_hash("sha256:a", SandboxLimits(), {})
    assert base != template_hash("sha256:b", SandboxLimits(), {})
    assert base != template_hash("sha256:a", SandboxLimits(cpus=2.0), {})
    assert base != template_hash("sha256:a", SandboxLimits(), {"K": "v"})


def _layout(directory: Path, tags: dict[str, str]) -> Path:
    manifests = [{"digest": digest, "annotations": {REF_NAME: tag}} for tag, digest in tags.items()]
    (directory / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": manifests}))
    return directory


def test_an_image_is_named_by_its_layout_and_tag(tmp_path: Path) -> None:
    layout = _layout(tmp_path, {"task-a": "sha256:aa", "task-b": "sha256:bb"})
    image = image_ref_from_layout(f"{layout}:task-b")
    assert (image.layout, image.tag, image.digest) == (layout, "task-b", "sha256:bb")
    with pytest.raises(LocalRuntimeError, match="name one as LAYOUT:TAG"):
        image_ref_from_layout(str(layout))
    with pytest.raises(LocalRuntimeError, match="no tag 'task-c'"):
        image_ref_from_layout(f"{layout}:task-c")
    with pytest.raises(LocalRuntimeError, match="not an OCI image layout"):
        image_ref_from_layout(str(tmp_path / "missing"))
    (tmp_path / "one").mkdir()
    only = _layout(tmp_path / "one", {"x": "sha256:xx"})
    assert image_ref_from_layout(str(only)).tag == "x"  # the one tag a layout holds needs no name


@given(st.dictionaries(st.text(min_size=1), st.floats(0, 1000)), st.floats(0, 2000))
def test_only_spares_idle_past_the_limit_are_retired(free_since: dict[str, float], now: float) -> None:
    retired = idle_spares(free_since, now)
    assert retired == sorted(retired)
    for key, since in free_since.items():
        assert (key in retired) == (now - since > SPARE_IDLE_SECONDS)


def test_a_spare_just_booted_or_just_returned_is_kept() -> None:
    assert idle_spares({"a": 100.0, "b": 85.0}, now=100.0 + SPARE_IDLE_SECONDS) == ["b"]
