"""Per-sandbox networking: a network namespace, a veth pair with its own /30, and a host firewall.

Each sandbox gets a slot (a number claimed with an O_EXCL file, so several runtimes on one host
never collide) that names its namespace (`sandfleet-<slot>`) and host veth (`sfl<slot>`) and picks
its addresses. The firewall lets the host open connections to sandboxes but drops every
connection a sandbox opens to the host or, through it, to another sandbox.

Sandboxes have no IPv6 at all: it is disabled in the namespace before the veth exists and on the
host end before it comes up (so neither end ever gets a link-local address), and ip6tables drops
whatever IPv6 could still arrive from or leave towards a sandbox veth.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
from pathlib import Path

from sandfleet.core.addressing import SlotAddresses, slot_addresses, slot_count
from sandfleet.local.commands import run_command
from sandfleet.local.errors import LocalRuntimeError

NETNS_PREFIX = "sandfleet-"
VETH_PREFIX = "sfl"
INPUT_CHAIN = "SANDFLEET-INPUT"
FORWARD_CHAIN = "SANDFLEET-FORWARD"
NO_IPV6_SYSCTLS = ("net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")


def netns_name(slot: int) -> str:
    """The network namespace of a slot."""
    return f"{NETNS_PREFIX}{slot}"


def veth_name(slot: int) -> str:
    """The host end of a slot's veth pair (interface names are capped at 15 bytes)."""
    return f"{VETH_PREFIX}{slot}"


class SlotTable:
    """Claims and frees slots as files in a directory shared by every runtime on the host."""

    def __init__(self, directory: Path, subnet: str) -> None:
        self.directory = directory
        self.subnet = subnet
        self.capacity = slot_count(subnet)
        self._next = 0

    def claim(self, owner: str) -> int:
        """Claim a free slot for `owner` (an instance id) and return it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for step in range(self.capacity):
            slot = (self._next + step) % self.capacity
            try:
                descriptor = os.open(self.directory / str(slot), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(descriptor, "w") as handle:
                handle.write(owner)
            self._next = slot + 1
            return slot
        raise LocalRuntimeError(f"all {self.capacity} sandbox network slots in {self.subnet} are taken")

    def free(self, slot: int) -> None:
        """Give a slot back."""
        with contextlib.suppress(FileNotFoundError):
            (self.directory / str(slot)).unlink()

    def owners(self) -> dict[int, str]:
        """Every claimed slot and its owner."""
        claimed: dict[int, str] = {}
        if not self.directory.is_dir():
            return claimed
        for entry in self.directory.iterdir():
            if entry.name.isdigit():
                try:
                    claimed[int(entry.name)] = entry.read_text().strip()
                except OSError as error:
                    if error.errno != errno.ENOENT:
                        raise
        return claimed

    def addresses(self, slot: int) -> SlotAddresses:
        """The addresses of a slot."""
        return slot_addresses(slot, self.subnet)


async def create_network(slot: int, addresses: SlotAddresses) -> None:
    """Create the slot's namespace and veth pair; the sandbox end is `eth0` inside the namespace.

    runsc (`--network=sandbox`) takes `eth0`'s address over into gVisor's own network stack when
    the sandbox starts, so the namespace is good for one sandbox only.
    """
    namespace, veth = netns_name(slot), veth_name(slot)
    prefix = addresses.prefix_length
    await delete_network(slot)
    host_side = "\n".join(
        [
            f"netns add {namespace}",
            # Interfaces created in the namespace from now on (its eth0) start with IPv6 disabled.
            f"netns exec {namespace} sysctl -q -w {' '.join(NO_IPV6_SYSCTLS)}",
            f"link add {veth} type veth peer name eth0 netns {namespace}",
            f"addr add {addresses.host}/{prefix} dev {veth}",
            f"link set {veth} up",
        ]
    )
    await run_command(["ip", "-batch", "-"], input_text=host_side + "\n")
    # Removes any link-local address the host end got on coming up; no sandbox runs here yet.
    _disable_host_ipv6(veth)
    inside = "\n".join(
        [
            f"addr add {addresses.sandbox}/{prefix} dev eth0",
            "link set eth0 up",
            "link set lo up",
        ]
    )
    await run_command(["ip", "-n", namespace, "-batch", "-"], input_text=inside + "\n")


async def delete_network(slot: int) -> None:
    """Remove the slot's namespace, veth and firewall exceptions (any of them may be gone)."""
    await run_command(["ip", "netns", "delete", netns_name(slot)], check=False)
    # Deleting the namespace destroys the veth pair, but asynchronously: delete it now as well.
    await run_command(["ip", "link", "delete", veth_name(slot)], check=False)
    await _remove_exceptions(slot)


async def allow_host_ports(slot: int, ports: tuple[int, ...]) -> None:
    """Let one sandbox open TCP connections to these ports on its host-side address.

    Only services listening on all host addresses (or on the veth's) are reachable this way; a
    service bound to the host's 127.0.0.1 stays out of reach, as the kernel never routes a
    sandbox's packets to the host's loopback.
    """
    for port in ports:
        if not 0 < port < 65536:
            raise LocalRuntimeError(f"allowed host port {port} is not a TCP port")
        rule = ["-i", veth_name(slot), "-p", "tcp", "--dport", str(port), "-j", "ACCEPT"]
        await run_command(["iptables", "-w", "-I", INPUT_CHAIN, "1", *rule])


async def _remove_exceptions(slot: int) -> None:
    listing = await run_command(["iptables", "-w", "-S", INPUT_CHAIN], check=False)
    marker = f"-i {veth_name(slot)} "
    for line in listing.stdout.splitlines():
        if line.startswith(f"-A {INPUT_CHAIN} ") and marker in line + " ":
            await run_command(["iptables", "-w", "-D", *shlex.split(line)[1:]], check=False)


def _disable_host_ipv6(veth: str) -> None:
    path = Path("/proc/sys/net/ipv6/conf") / veth / "disable_ipv6"
    try:
        # A write to procfs does not block the event loop.
        path.write_text("1\n")
    except FileNotFoundError:
        return  # the host has no IPv6 at all
    except OSError as error:
        raise LocalRuntimeError(f"cannot disable IPv6 on {veth} ({path}): {error.strerror}") from None


def netns_path(slot: int) -> str:
    """Where `ip netns` bind-mounts the slot's namespace."""
    return f"/run/netns/{netns_name(slot)}"


async def install_firewall() -> None:
    """Drop connections sandboxes open to the host and forwarded traffic from or to sandboxes.

    Replies to connections the host opened (the runtime talking to agents) stay allowed.
    Idempotent: chains and jumps are created only when missing.
    """
    match = f"{VETH_PREFIX}+"
    for chain in (INPUT_CHAIN, FORWARD_CHAIN):
        await run_command(["iptables", "-w", "-N", chain], check=False)
    rules = [
        (INPUT_CHAIN, ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"]),
        (INPUT_CHAIN, ["-j", "DROP"]),
        (FORWARD_CHAIN, ["-j", "DROP"]),
    ]
    for chain, rule in rules:
        await _ensure_rule("iptables", chain, rule, ["-A", chain])
    jumps = [
        ("INPUT", ["-i", match, "-j", INPUT_CHAIN]),
        ("FORWARD", ["-i", match, "-j", FORWARD_CHAIN]),
        ("FORWARD", ["-o", match, "-j", FORWARD_CHAIN]),
    ]
    for builtin, rule in jumps:
        await _ensure_rule("iptables", builtin, rule, ["-I", builtin, "1"])
    await _install_ipv6_firewall()


async def _ensure_rule(tool: str, chain: str, rule: list[str], add: list[str]) -> None:
    """Add `rule` to `chain` with `add` (append or insert) unless it is there already."""
    if (await run_command([tool, "-w", "-C", chain, *rule], check=False)).returncode != 0:
        await run_command([tool, "-w", *add, *rule])


async def _install_ipv6_firewall() -> None:
    """Drop all IPv6 from and to sandbox veths (defence in depth: they have IPv6 disabled)."""
    match = f"{VETH_PREFIX}+"
    for chain in (INPUT_CHAIN, FORWARD_CHAIN):
        await run_command(["ip6tables", "-w", "-N", chain], check=False)
        await _ensure_rule("ip6tables", chain, ["-j", "DROP"], ["-A", chain])
    jumps = [
        ("INPUT", ["-i", match, "-j", INPUT_CHAIN]),
        ("OUTPUT", ["-o", match, "-j", INPUT_CHAIN]),
        ("FORWARD", ["-i", match, "-j", FORWARD_CHAIN]),
        ("FORWARD", ["-o", match, "-j", FORWARD_CHAIN]),
    ]
    for builtin, rule in jumps:
        await _ensure_rule("ip6tables", builtin, rule, ["-I", builtin, "1"])
