"""Network slots: claimed with O_EXCL files so runtimes on one host never share an address."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandfleet.local.errors import LocalRuntimeError
from sandfleet.local.network import SlotTable, netns_name, veth_name


def test_claims_are_exclusive_across_tables_and_freed_slots_come_back(tmp_path: Path) -> None:
    first = SlotTable(tmp_path, "10.231.0.0/29")
    second = SlotTable(tmp_path, "10.231.0.0/29")
    assert first.capacity == 2
    a = first.claim("instance-a")
    b = second.claim("instance-b")
    assert a != b
    assert first.owners() == {a: "instance-a", b: "instance-b"}
    with pytest.raises(LocalRuntimeError, match="all 2 sandbox network slots"):
        first.claim("instance-a")
    first.free(a)
    first.free(a)  # freeing twice is harmless
    assert second.claim("instance-b") == a
    assert str(first.addresses(a).sandbox).startswith("10.231.0.")


def test_names_fit_linux_interface_limits() -> None:
    assert len(veth_name(16383)) <= 15
    assert netns_name(7) == "sandfleet-7"
