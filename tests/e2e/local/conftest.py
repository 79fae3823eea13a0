"""Real gVisor sandboxes for e2e tests: runsc and the image are built on demand (cached), never skipped."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandfleet.local.artifacts import GVISOR_SCRIPT, IMAGE_BUILD_SCRIPT, ImageRef, image_ref_from_json
from sandfleet.local.runtime import LocalRuntime, RunscSandbox

BUILD_TIMEOUT_S = 1800


def _build(argv: list[str], what: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if result.returncode != 0:
        pytest.fail(f"{what} failed ({' '.join(argv)}):\n{result.stderr[-4000:]}")
    return result.stdout


@pytest.fixture(scope="session")
def runsc() -> Path:
    """The pinned runsc, built by hack/gvisor (a cache hit after the first build)."""
    if os.geteuid() != 0:
        pytest.fail("gVisor e2e tests need root (runsc, network namespaces, cgroups)")
    _build([str(GVISOR_SCRIPT), "build"], "building runsc")
    runsc = Path(_build([str(GVISOR_SCRIPT), "bin-dir"], "locating runsc").strip()) / "runsc"
    version = subprocess.run([str(runsc), "--version"], capture_output=True, text=True, check=False)
    if version.returncode != 0:
        pytest.fail(f"{runsc} does not run: {version.stderr}")
    return runsc


@pytest.fixture(scope="session")
def base_image(runsc: Path) -> ImageRef:
    """The sandbox image, built offline by sandbox_image/build (a cache hit after the first build)."""
    out = _build([str(IMAGE_BUILD_SCRIPT), "--json"], "building the sandbox image")
    return image_ref_from_json(out.strip().splitlines()[-1])


def build_task_image(name: str, workspace: Path, setup: str | None = None) -> ImageRef:
    """A task image on top of the base, built the same offline way."""
    argv = [str(IMAGE_BUILD_SCRIPT), "--json", "task", "--name", name, "--workspace", str(workspace)]
    if setup:
        argv += ["--setup", setup]
    out = _build(argv, f"building task image {name}")
    return image_ref_from_json(out.strip().splitlines()[-1])


@pytest.fixture
async def runtime(runsc: Path, base_image: ImageRef) -> AsyncIterator[LocalRuntime]:
    """A started local runtime; closing it must leave nothing behind (checked by the cleanup tests)."""
    async with LocalRuntime(base_image, runsc) as started:
        yield started


@pytest.fixture
async def sandbox(runtime: LocalRuntime) -> RunscSandbox:
    """One ready sandbox with default limits."""
    return await runtime.create()


@pytest.fixture
async def agent(sandbox: RunscSandbox) -> AsyncIterator[httpx.AsyncClient]:
    """A client for the sandbox's agent, on the sandbox's own address, with its token."""
    async with httpx.AsyncClient(
        base_url=sandbox.url, headers=sandbox.headers, timeout=60, trust_env=False
    ) as client:
        yield client


async def sh(client: httpx.AsyncClient, command: str, **extra: object) -> dict[str, Any]:
    """Run a shell command through the agent and return the JSON result (asserting HTTP 200)."""
    response = await client.post("/v1/exec", json={"shell": command, **extra})
    assert response.status_code == 200, response.text
    body = response.json()
    assert isinstance(body, dict)
    return body


def host_debris(runtime: LocalRuntime, sandboxes: list[RunscSandbox]) -> dict[str, list[str]]:
    """Everything of these sandboxes (and the runtime) still on the host, by kind."""
    from sandfleet.local import hoststate, network

    debris: dict[str, list[str]] = {}
    processes = [
        str(pid)
        for pid in hoststate.runsc_processes(runtime.runsc_root)
        if any(sandbox.id in _cmdline(pid) for sandbox in sandboxes) or not sandboxes
    ]
    debris["processes"] = processes
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    names = {line.split()[0] for line in namespaces.splitlines() if line.strip()}
    debris["netns"] = [network.netns_name(s.slot) for s in sandboxes if network.netns_name(s.slot) in names]
    links = json.loads(
        subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True).stdout
    )
    link_names = {link["ifname"] for link in links}
    debris["veths"] = [
        network.veth_name(s.slot) for s in sandboxes if network.veth_name(s.slot) in link_names
    ]
    debris["cgroups"] = [
        str(path)
        for sandbox in sandboxes
        for path in Path("/sys/fs/cgroup").glob(f"*/{hoststate.CGROUP_PARENT}/{sandbox.id}")
    ]
    debris["slots"] = [str(s.slot) for s in sandboxes if s.slot in runtime.slots.owners()]
    return {kind: found for kind, found in debris.items() if found}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
