"""`sandfleet serve --local` under real gVisor: a dead sandbox ends its callers' calls at once, and
the server stops on SIGTERM or Ctrl-C leaving nothing of its sandboxes on the host."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sandfleet.core.addressing import DEFAULT_SUBNET
from sandfleet.local import hoststate, network
from sandfleet.local.artifacts import ImageRef
from sandfleet.local.network import SlotTable
from sandfleet.local.runtime import DEFAULT_STATE_DIR
from tests.support.servers import free_port, wait_until_ready

pytestmark = pytest.mark.gvisor

TOKEN = {"Authorization": "Bearer local-token"}
LONG_EXEC = {"argv": ["sleep", "600"], "timeout_s": 900}


@dataclass
class Served:
    """A running `sandfleet serve --local`, leader of its own process group (as in a terminal)."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def lease(self, client: httpx.Client) -> tuple[str, str]:
        """Acquire one sandbox: its lease id and sandbox name."""
        response = client.post("/v1/leases", json={"pool": "python", "wait_seconds": 60})
        assert response.status_code == 201, response.text
        lease = response.json()["leases"][0]
        return str(lease["id"]), str(lease["sandbox"])


@pytest.fixture
def served(runsc: Path, base_image: ImageRef, tmp_path: Path) -> Iterator[Served]:
    port = free_port()
    tokens = tmp_path / "tokens"
    tokens.write_text("local-token actor-0\n")
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "sandfleet.cli", "serve", "--local", "--port", str(port),
             "--warm", "1", "--pool", "python", "--token-file", str(tokens)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, process, log, timeout=180, what="sandfleet serve to have a warm sandbox")
        yield Served(url, process, log)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def sentry_pids(name: str) -> list[int]:
    """The host's gVisor sentry (runsc-sandbox) processes of one sandbox (runsc names it after it)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if os.path.basename(argv[0].decode(errors="replace")) == "runsc-sandbox" and any(
            name.encode() in arg for arg in argv
        ):
            pids.append(int(proc.name))
    return pids


def test_a_dead_sandbox_ends_calls_at_once_with_sandbox_lost(served: Served) -> None:
    with httpx.Client(base_url=served.url, headers=TOKEN, timeout=120) as client:
        lease_id, name = served.lease(client)
        assert client.post(f"/v1/leases/{lease_id}/exec", json={"argv": ["true"]}).status_code == 200
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(client.post, f"/v1/leases/{lease_id}/exec", json=LONG_EXEC)
            time.sleep(1.0)
            assert not pending.done()
            # As the kernel's OOM killer would: the sentry dies, with its network stack, no reset sent.
            pids = sentry_pids(name)
            assert pids, f"no runsc-sandbox process found for {name}"
            killed = time.monotonic()
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            response = pending.result(timeout=60)
            ended_after = time.monotonic() - killed
        print(f"in-flight exec ended {ended_after:.2f} s after its sandbox was killed")
        assert response.status_code == 502, response.text
        assert response.json()["error"] == "sandbox_lost"
        assert ended_after < 10
        # Later calls fail at once too, and the lease can still be released.
        started = time.monotonic()
        later = client.post(f"/v1/leases/{lease_id}/exec", json={"argv": ["true"]})
        assert (later.status_code, later.json()["error"]) == (502, "sandbox_lost")
        assert time.monotonic() - started < 5
        assert client.delete(f"/v1/leases/{lease_id}").status_code == 200


def test_a_frozen_sandbox_holds_a_call_no_longer_than_its_timeout_plus_a_margin(served: Served) -> None:
    # Frozen, not dead: no process exits and no reset comes, so only a bound on the wait helps.
    with httpx.Client(base_url=served.url, headers=TOKEN, timeout=120) as client:
        lease_id, name = served.lease(client)
        # The gateway's connection to the agent is open (kept alive) before the sandbox freezes.
        assert client.post(f"/v1/leases/{lease_id}/exec", json={"argv": ["true"]}).status_code == 200
        pids = sentry_pids(name)
        assert pids
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            response = client.post(
                f"/v1/leases/{lease_id}/exec", json={"argv": ["sleep", "600"], "timeout_s": 2}
            )
            waited = time.monotonic() - started
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
    print(f"a call with timeout_s=2 to a frozen sandbox ended after {waited:.1f} s")
    assert (response.status_code, response.json()["error"]) == (502, "sandbox_lost")
    assert 2 + 30 <= waited < 2 + 30 + 10


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_serve_stops_on_a_signal_and_leaves_nothing_behind(served: Served, signum: signal.Signals) -> None:
    slots = SlotTable(DEFAULT_STATE_DIR / "slots", DEFAULT_SUBNET)
    with httpx.Client(base_url=served.url, headers=TOKEN, timeout=120) as client:
        lease_id, name = served.lease(client)
        instance = name.split("-")[1]
        instance_dir = DEFAULT_STATE_DIR / "instances" / instance
        owned = [slot for slot, owner in slots.owners().items() if owner == instance]
        assert owned
        assert instance_dir.is_dir()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            # A call in flight must not keep the server (or its sandboxes) alive.
            pending = pool.submit(client.post, f"/v1/leases/{lease_id}/exec", json=LONG_EXEC)
            time.sleep(1.0)
            # To the whole process group, as a terminal's Ctrl-C or a service manager's stop does.
            stopped = time.monotonic()
            os.killpg(served.process.pid, signum)
            code = served.process.wait(timeout=60)
            took = time.monotonic() - stopped
            with contextlib.suppress(httpx.TransportError):
                pending.result(timeout=30)
    print(f"serve exited {code} {took:.1f} s after {signum.name}")
    assert took < 30
    left = {
        "processes": hoststate.runsc_processes(instance_dir / "runsc"),
        "mounts": hoststate.mounts_under(instance_dir),
        "instance_dir": instance_dir.exists(),
        "cgroups": list(
            Path("/sys/fs/cgroup").glob(
                f"*/{hoststate.CGROUP_PARENT}/{hoststate.container_prefix(instance)}*"
            )
        ),
        "slots": [slot for slot, owner in slots.owners().items() if owner == instance],
        # A slot another runtime has claimed since may rightly have its namespace again.
        "netns": [
            slot for slot in owned if Path(network.netns_path(slot)).exists() and slot not in slots.owners()
        ],
    }
    assert {kind: found for kind, found in left.items() if found} == {}, served.log.read_text()[-3000:]
