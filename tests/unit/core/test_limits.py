"""Parsing sandbox limits from Kubernetes-style quantities."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.limits import (
    MIN_MEMORY_BYTES,
    LimitError,
    SandboxLimits,
    limits_from,
    parse_cpus,
    parse_memory,
    parse_pids,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("512Mi", 512 << 20), ("1Gi", 1 << 30), ("1.5Gi", 3 << 29), ("100M", 100_000_000), (1 << 30, 1 << 30)],
)
def test_memory_quantities(text: str | int, expected: int) -> None:
    assert parse_memory(text) == expected


@pytest.mark.parametrize("text", ["lots", "12 parsecs", "-1Gi", "1Mi", "", "1e9"])
def test_bad_memory_is_refused_with_a_reason(text: str) -> None:
    with pytest.raises(LimitError, match="memory"):
        parse_memory(text)


@given(st.integers(min_value=MIN_MEMORY_BYTES >> 20, max_value=1 << 20))
def test_mebibytes_roundtrip(mebibytes: int) -> None:
    assert parse_memory(f"{mebibytes}Mi") == mebibytes << 20


@pytest.mark.parametrize(("text", "expected"), [("500m", 0.5), ("2", 2.0), (1.5, 1.5), ("250m", 0.25)])
def test_cpu_quantities(text: str | float, expected: float) -> None:
    assert parse_cpus(text) == expected


@pytest.mark.parametrize("text", ["fast", "0", "5m", "2000", "m"])
def test_bad_cpu_is_refused(text: str) -> None:
    with pytest.raises(LimitError, match="cpu"):
        parse_cpus(text)


@given(st.integers(min_value=10, max_value=64_000))
def test_millicores_give_a_quota_proportional_to_the_period(millicores: int) -> None:
    limits = SandboxLimits(cpus=parse_cpus(f"{millicores}m"))
    quota, period = limits.cpu_quota()
    assert period == 100_000
    assert quota == max(millicores * 100, 1000)


def test_pids_and_defaults() -> None:
    assert parse_pids("64") == 64
    with pytest.raises(LimitError, match="pids"):
        parse_pids("many")
    with pytest.raises(LimitError, match="minimum"):
        parse_pids(1)
    assert limits_from() == SandboxLimits()
    assert limits_from(memory="1Gi", cpus="500m", pids=32) == SandboxLimits(1 << 30, 0.5, 32)
