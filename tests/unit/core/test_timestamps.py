"""Times as the Kubernetes API spells them: to the second (`Time`), to the microsecond (`MicroTime`)."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.timestamps import format_micro_time, format_time, parse_time

# 1970 to 2100, to the microsecond: what a clock reading may be.
UNIX_MICROS = st.integers(min_value=0, max_value=4_102_444_800 * 10**6)


def test_timestamps_parse_from_text_or_parsed() -> None:
    text = "2026-11-29T12:00:00Z"
    assert parse_time(text) == parse_time(datetime(2026, 11, 29, 12, tzinfo=UTC)) == 1795953600.0
    assert parse_time(None) is None
    assert parse_time("") is None


def test_a_time_is_to_the_second_and_a_micro_time_to_the_microsecond_in_utc() -> None:
    assert format_time(1795953600.75) == "2026-11-29T12:00:00Z"
    assert format_micro_time(1795953600.75) == "2026-11-29T12:00:00.750000Z"
    assert format_micro_time(0.0) == "1970-01-01T00:00:00.000000Z"


@given(UNIX_MICROS)
def test_what_is_written_reads_back(micros: int) -> None:
    unix = micros / 10**6
    # Both spell what datetime.now(UTC) would have read at that moment (the helper they replace).
    moment = datetime.fromtimestamp(unix, UTC)
    assert format_micro_time(unix) == moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert parse_time(format_micro_time(unix)) == moment.timestamp()
    assert parse_time(format_time(unix)) == float(int(moment.timestamp()))
