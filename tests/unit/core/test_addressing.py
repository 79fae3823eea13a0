"""Per-sandbox /30 addresses inside the runtime's subnet."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.addressing import slot_addresses, slot_count


def test_first_slots() -> None:
    first = slot_addresses(0, "10.231.0.0/16")
    assert (str(first.host), str(first.sandbox)) == ("10.231.0.1", "10.231.0.2")
    assert str(slot_addresses(1, "10.231.0.0/16").sandbox) == "10.231.0.6"
    assert slot_count("10.231.0.0/16") == 16384


@given(st.integers(0, 16383), st.integers(0, 16383))
def test_distinct_slots_never_share_a_network(a: int, b: int) -> None:
    left, right = slot_addresses(a), slot_addresses(b)
    left_net = ipaddress.IPv4Network(f"{left.host}/30", strict=False)
    right_net = ipaddress.IPv4Network(f"{right.host}/30", strict=False)
    assert left.sandbox in left_net
    assert left_net.subnet_of(ipaddress.IPv4Network("10.231.0.0/16"))
    assert (left_net == right_net) == (a == b)


@pytest.mark.parametrize("index", [-1, 16384])
def test_out_of_range_slot(index: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        slot_addresses(index)


def test_tiny_subnet_is_refused() -> None:
    with pytest.raises(ValueError, match="smaller"):
        slot_count("10.0.0.0/31")
