"""Per-sandbox addresses: each slot gets its own /30 (host end, sandbox end) inside one subnet."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

DEFAULT_SUBNET = "10.231.0.0/16"


@dataclass(frozen=True)
class SlotAddresses:
    """The two ends of one sandbox's point-to-point link."""

    host: ipaddress.IPv4Address
    sandbox: ipaddress.IPv4Address
    prefix_length: int = 30


def slot_count(subnet: str = DEFAULT_SUBNET) -> int:
    """How many /30 slots the subnet holds."""
    network = ipaddress.IPv4Network(subnet)
    if network.prefixlen > 30:
        raise ValueError(f"subnet {subnet} is smaller than a /30")
    return int(network.num_addresses // 4)


def slot_addresses(index: int, subnet: str = DEFAULT_SUBNET) -> SlotAddresses:
    """The addresses of slot `index`: .1 on the host side and .2 in the sandbox of its /30."""
    count = slot_count(subnet)
    if not 0 <= index < count:
        raise ValueError(f"slot {index} is outside 0..{count - 1} for {subnet}")
    base = ipaddress.IPv4Network(subnet).network_address + index * 4
    return SlotAddresses(host=base + 1, sandbox=base + 2)
