"""Holes around one local gVisor sandbox, tried from inside it (and from the host) under real runsc:
IPv6 to the host, host disk filled through the agent's output, agents callable without a token."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandfleet.local import network
from sandfleet.local.runtime import LocalRuntime, RunscSandbox
from tests.e2e.local.conftest import sh

pytestmark = pytest.mark.gvisor

CONNECT6 = (
    "import socket, sys\n"
    "host, port = sys.argv[1], int(sys.argv[2])\n"
    "family = socket.AF_INET6 if ':' in host else socket.AF_INET\n"
    "s = socket.socket(family); s.settimeout(2)\n"
    "try:\n"
    "    if family == socket.AF_INET6:\n"
    "        s.connect((host, port, 0, socket.if_nametoindex('eth0')))\n"
    "    else:\n"
    "        s.connect((host, port))\n"
    "    print('connected')\n"
    "except OSError as e:\n"
    "    print('refused' if isinstance(e, ConnectionRefusedError) else f'blocked {e!r}')\n"
)
FLOOD_MIB = 32  # to each of the agent's stdout and stderr
TAIL_BOUND = 64 * 1024  # what the runtime may keep of it, in memory
FLOOD = (
    "import os, sys\n"
    "chunk = b'x' * (1 << 20)\n"
    "written = 0\n"
    "for target in ('/proc/1/fd/1', '/proc/1/fd/2'):\n"
    "    try:\n"
    "        fd = os.open(target, os.O_WRONLY)\n"
    "    except OSError as e:\n"
    "        print(f'{target}: {e!r}'); continue\n"
    "    sent = 0\n"
    "    while sent < int(sys.argv[1]) << 20:\n"
    "        sent += os.write(fd, chunk)\n"
    "    written += sent\n"
    "    os.close(fd)\n"
    "print(f'wrote {written}')\n"
)


class V6Server:
    """A TCP server on the host bound to every IPv6 (and, dual-stack, IPv4) address; counts accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


@pytest.fixture
def v6_server() -> Iterator[V6Server]:
    server = V6Server()
    yield server
    server.close()


def _ip_json(*args: str) -> list[dict[str, object]]:
    out = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, check=True).stdout
    parsed: list[dict[str, object]] = json.loads(out or "[]")
    return parsed


def _ipv6_addresses(*selector: str, netns: str | None = None) -> list[str]:
    where = ["-n", netns] if netns else []
    return [
        str(info["local"])
        for link in _ip_json(*where, "-6", "addr", "show", *selector)
        for info in link.get("addr_info", [])  # type: ignore[attr-defined]
        if "local" in info
    ]


def _eui64_link_local(mac: str) -> str:
    """The link-local address the kernel would give an interface with this MAC (RFC 4291)."""
    octets = [int(part, 16) for part in mac.split(":")]
    octets[0] ^= 0x02
    eui = [*octets[:3], 0xFF, 0xFE, *octets[3:]]
    groups = [f"{eui[i] << 8 | eui[i + 1]:x}" for i in range(0, 8, 2)]
    return "fe80::" + ":".join(groups)


def host_targets(sandbox: RunscSandbox) -> list[str]:
    """Every IPv6 address of the host a sandbox might try: the veth's own (or the one it would have)
    and the host's global ones."""
    veth = network.veth_name(sandbox.slot)
    (link,) = _ip_json("link", "show", "dev", veth)
    targets = [*_ipv6_addresses("dev", veth), _eui64_link_local(str(link["address"]))]
    targets += [a for a in _ipv6_addresses("scope", "global") if not a.startswith("fe80")]
    return sorted(set(targets))


async def connect_from(agent: httpx.AsyncClient, host: str, port: int) -> str:
    result = await sh(agent, f"python3 -c {_quote(CONNECT6)} {host} {port}")
    return str(result["stdout"]).strip()


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


async def test_ipv6_from_a_sandbox_reaches_nothing_on_the_host(
    agent: httpx.AsyncClient, sandbox: RunscSandbox, runtime: LocalRuntime, v6_server: V6Server
) -> None:
    targets = host_targets(sandbox)
    outcomes = {target: await connect_from(agent, target, v6_server.port) for target in targets}
    assert not [t for t, outcome in outcomes.items() if outcome == "connected"], outcomes
    # Neither end of the sandbox's veth has an IPv6 address (so nothing answers on link-local).
    assert _ipv6_addresses("dev", network.veth_name(sandbox.slot)) == []
    assert _ipv6_addresses("dev", "eth0", netns=network.netns_name(sandbox.slot)) == []
    # And, should IPv6 come back on a veth, ip6tables drops it (defence in depth).
    listing = await asyncio.to_thread(
        subprocess.run, ["ip6tables", "-w", "-S"], capture_output=True, text=True, check=True
    )
    rules = listing.stdout
    assert f"-A INPUT -i {network.VETH_PREFIX}+ -j {network.INPUT_CHAIN}" in rules
    assert f"-A {network.INPUT_CHAIN} -j DROP" in rules
    # IPv4 to the host's side of the veth stays blocked too.
    host_v4 = str(runtime.slots.addresses(sandbox.slot).host)
    assert await connect_from(agent, host_v4, v6_server.port) != "connected"
    # Control: the server does accept, over IPv6, from the host itself.
    with socket.create_connection(("::1", v6_server.port), timeout=2):
        pass
    await asyncio.sleep(0.3)
    assert v6_server.accepted == 1


def host_bytes(runtime: LocalRuntime) -> int:
    """Bytes of files the runtime keeps on the host for its sandboxes (the shared rootfs aside)."""
    total = 0
    for directory, subdirs, files in os.walk(runtime.instance_dir):
        if Path(directory) == runtime.instance_dir:
            subdirs[:] = [d for d in subdirs if d != "rootfs"]
        for name in files:
            try:
                total += (Path(directory) / name).lstat().st_blocks * 512
            except OSError:
                continue
    return total


def _without_user_flags(argv: list[str]) -> list[str]:
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--exec-user", "--verifier-user"):
            skip = True
        else:
            kept.append(arg)
    return kept


async def test_agent_output_floods_never_reach_the_host_disk(runtime: LocalRuntime) -> None:
    # The worst case, whatever the agent's user separation does: this sandbox's agent is started
    # without --exec-user/--verifier-user, so its commands run as the agent and may write to its
    # stdout and stderr (test_agent_users proves the sandbox user cannot). What is under test here
    # is how much of that the host stores.
    served = runtime._served[runtime.image.digest]
    assert "--exec-user" in served.config.argv
    flagless = dataclasses.replace(served.config, argv=_without_user_flags(served.config.argv))
    runtime._served[runtime.image.digest] = dataclasses.replace(served, config=flagless)
    try:
        sandbox = await runtime.create()
    finally:
        runtime._served[runtime.image.digest] = served
    async with httpx.AsyncClient(
        base_url=sandbox.url, headers=sandbox.headers, timeout=300, trust_env=False
    ) as agent:
        before = await asyncio.to_thread(host_bytes, runtime)
        started = time.monotonic()
        flood = await sh(agent, f"python3 -c {_quote(FLOOD)} {FLOOD_MIB}", timeout_s=280)
        seconds = time.monotonic() - started
        after = await asyncio.to_thread(host_bytes, runtime)
        print(f"flood: {flood['stdout'].strip()!r} in {seconds:.1f} s; host bytes {before} -> {after}")
        assert f"wrote {2 * FLOOD_MIB << 20}" in flood["stdout"], flood
        assert after - before < 1 << 20, f"the host stored {after - before} bytes of a sandbox's output"
        assert 0 < len(runtime.output_tail(sandbox)) <= TAIL_BOUND
        # The sandbox still works afterwards.
        assert (await sh(agent, "echo alive"))["stdout"] == "alive\n"


async def test_an_agent_refuses_callers_without_its_own_token(runtime: LocalRuntime) -> None:
    mine, other = await runtime.create(), await runtime.create()
    assert mine.token
    assert other.token
    assert mine.token != other.token
    async with httpx.AsyncClient(base_url=mine.url, timeout=30, trust_env=False) as host:
        for headers in ({}, other.headers, {"Authorization": "Bearer wrong"}):
            exec_ = await host.post("/v1/exec", json={"argv": ["id"]}, headers=headers)
            assert exec_.status_code == 401, exec_.text
            read = await host.get("/v1/files", params={"path": "/etc/passwd"}, headers=headers)
            assert read.status_code == 401, read.text
        # Readiness stays open (probes carry no token); the right token works.
        assert (await host.get("/v1/ready")).status_code == 200
        ok = await host.post("/v1/exec", json={"argv": ["true"]}, headers=mine.headers)
        assert ok.status_code == 200
