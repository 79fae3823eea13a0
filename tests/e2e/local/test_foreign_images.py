"""Images sandfleet did not build are sandboxes: the agent bundle is injected (`serve --local --image`).

Four images made here from Debian packages (tests/support/foreign_images.py): busybox only, an
Alpine-style musl root with no glibc, a distroless root with one static binary and no /bin/sh, and
an older distribution (Debian 11: glibc 2.31, no python). Each is leased through the gateway; its
commands see the image's own environment and working directory and nothing of the bundle's; the
bundle is read-only to them.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandfleet.local.artifacts import ImageRef
from sandfleet.local.injection import AGENT_ID_BASE, MOUNT_POINT
from sandfleet.local.runtime import LocalRuntime, SandboxSpec
from tests.support.foreign_images import (
    BULLSEYE_GLIBC,
    BULLSEYE_MARKER,
    BULLSEYE_WORKDIR,
    BUSYBOX_MARKER,
    BUSYBOX_PATH,
    BUSYBOX_WORKDIR,
    IMAGES,
    SQUATTER_ID,
    build_foreign_image,
)
from tests.support.servers import start_local_serve, stop_local_serve

pytestmark = pytest.mark.gvisor

AUTH = {"Authorization": "Bearer local-token"}
# What the agent's own start must never hand to the commands it runs.
BUNDLE_VARIABLES = ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONHOME", "PYTHONPATH", "SANDFLEET_AGENT_TOKEN")


@dataclass(frozen=True)
class Served:
    url: str
    images: dict[str, ImageRef]


@pytest.fixture(scope="module")
def foreign(runsc: Path) -> dict[str, ImageRef]:
    """The images, built offline once (cached)."""
    return {name: build_foreign_image(name) for name in IMAGES}


@pytest.fixture(scope="module")
def served(foreign: dict[str, ImageRef], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One `serve --local` of the images, one warm of each; no sandbox left behind after."""
    images = [arg for image in foreign.values() for arg in ("--image", f"{image.layout}:{image.tag}")]
    url, process, log = start_local_serve(
        tmp_path_factory.mktemp("serve"), warm=1, extra_args=images, timeout=300
    )
    try:
        yield Served(url, foreign)
    finally:
        stop_local_serve(process, log)


@pytest.fixture
def lease(served: Served) -> Iterator[Any]:
    """Lease a sandbox of an image by its tag; released after the test."""
    taken: list[str] = []

    def take(image: str) -> str:
        response = httpx.post(
            f"{served.url}/v1/leases", json={"image": image, "wait_seconds": 120}, headers=AUTH, timeout=150
        )
        assert response.status_code == 201, response.text
        (view,) = response.json()["leases"]
        assert view["image_digest"] == served.images[image].digest
        taken.append(view["id"])
        return str(view["id"])

    yield take
    for lease_id in taken:
        httpx.delete(f"{served.url}/v1/leases/{lease_id}", headers=AUTH, timeout=60)


def call(served: Served, lease_id: str, method: str, route: str, **options: Any) -> httpx.Response:
    return httpx.request(
        method, f"{served.url}/v1/leases/{lease_id}{route}", headers=AUTH, timeout=120, **options
    )


def shell(served: Served, lease_id: str, command: str) -> dict[str, Any]:
    response = call(served, lease_id, "POST", "/exec", json={"shell": command})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_busybox_commands_get_the_images_environment_and_workdir(served: Served, lease: Any) -> None:
    lease_id = lease("busybox")
    result = shell(served, lease_id, "echo $PATH; pwd; echo $MARKER; id -u; id -g; cat hello.txt; env")
    assert result["exit_code"] == 0, result
    lines = result["stdout"].splitlines()
    assert lines[:3] == [BUSYBOX_PATH, BUSYBOX_WORKDIR, BUSYBOX_MARKER]
    # The image's passwd names the first id the runtime would pick: its agent users step past it.
    exec_uid, exec_gid = int(lines[3]), int(lines[4])
    assert exec_uid == exec_gid
    assert exec_uid > SQUATTER_ID >= AGENT_ID_BASE
    assert lines[5] == "hello from the image"
    environment = dict(line.split("=", 1) for line in lines[6:] if "=" in line)
    assert not set(BUNDLE_VARIABLES) & set(environment), environment
    assert not any(MOUNT_POINT in value for value in environment.values()), environment

    # The files routes' root is the working directory too; what they write, the commands read.
    written = call(served, lease_id, "PUT", "/files", params={"path": "notes/a.txt"}, content=b"written\n")
    assert written.status_code in (200, 201, 204), written.text
    assert shell(served, lease_id, f"cat {BUSYBOX_WORKDIR}/notes/a.txt")["stdout"] == "written\n"
    shell(served, lease_id, "echo by-the-command > b.txt")
    read = call(served, lease_id, "GET", "/files", params={"path": "b.txt"})
    assert read.status_code == 200
    assert read.content == b"by-the-command\n"


def test_busybox_evaluate_applies_a_patch_with_the_bundled_git(served: Served, lease: Any) -> None:
    lease_id = lease("busybox")
    patch = "--- a/hello.txt\n+++ b/hello.txt\n@@ -1 +1 @@\n-hello from the image\n+hello, patched\n"
    assert shell(served, lease_id, "command -v git || echo no-git")["stdout"] == "no-git\n"
    response = call(
        served, lease_id, "POST", "/evaluate", json={"patch": patch, "shell": "grep -q patched hello.txt"}
    )
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["patch"] == {"applied": True, "files": ["hello.txt"]}
    assert (report["outcome"], report["reward"]) == ("passed", 1.0), report
    failing = call(served, lease_id, "POST", "/evaluate", json={"shell": "grep -q never hello.txt"})
    assert failing.json()["outcome"] == "failed"


def test_the_bundle_is_read_only_to_the_episode(served: Served, lease: Any) -> None:
    lease_id = lease("busybox")
    attempt = shell(
        served,
        lease_id,
        f"touch {MOUNT_POINT}/x; echo >> {MOUNT_POINT}/manifest.json; rm -rf {MOUNT_POINT}/lib; "
        f"mv {MOUNT_POINT} /moved; ls {MOUNT_POINT}/lib | wc -l",
    )
    assert int(attempt["stdout"].split()[-1]) > 10  # every library still there
    assert "Read-only file system" in attempt["stderr"] or "Permission denied" in attempt["stderr"]
    # The agent still works: it runs from that bundle.
    assert shell(served, lease_id, "echo alive")["stdout"] == "alive\n"


def test_a_musl_image_without_glibc(served: Served, lease: Any) -> None:
    lease_id = lease("musl")
    result = shell(
        served, lease_id, "/lib/ld-musl-x86_64.so.1 2>&1 | head -1; ls /lib64 2>&1; pwd; echo $PATH"
    )
    lines = result["stdout"].splitlines()
    assert lines[0] == "musl libc (x86_64)"
    assert "No such file" in lines[1]  # no glibc loader in the image
    assert lines[2] == "/workspace"  # no WorkingDir: sandfleet's working area
    assert lines[3] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_a_distroless_image_without_a_shell(served: Served, lease: Any) -> None:
    lease_id = lease("distroless")
    ran = call(served, lease_id, "POST", "/exec", json={"argv": ["busybox", "sh", "-c", "echo $PATH; pwd"]})
    assert ran.status_code == 200, ran.text
    assert ran.json()["stdout"] == "/app\n/app\n"
    no_shell = call(served, lease_id, "POST", "/exec", json={"shell": "echo hi"})
    assert no_shell.status_code == 422
    assert no_shell.json()["error"] == "command_not_found", no_shell.text
    written = call(served, lease_id, "PUT", "/files", params={"path": "out.txt"}, content=b"data")
    assert written.status_code in (200, 201, 204), written.text
    assert call(served, lease_id, "GET", "/files", params={"path": "/app/out.txt"}).content == b"data"


def test_an_older_glibc_image_without_python(served: Served, lease: Any) -> None:
    """Debian 11: its own glibc 2.31 and bash run the commands; the agent's Python is the bundle's."""
    lease_id = lease("bullseye")
    result = shell(
        served,
        lease_id,
        "ldd --version | head -1; cat /etc/debian_version; echo $MARKER; pwd; echo $PATH; "
        "command -v python3 python python2 || echo no-python; ls /usr/bin | grep -c '^python' || true; "
        "bash --version | head -1; cat README",
    )
    assert result["exit_code"] == 0, result
    lines = result["stdout"].splitlines()
    assert lines[0].endswith(f" {BULLSEYE_GLIBC}"), lines[0]  # "ldd (Debian GLIBC 2.31-13+deb11u..) 2.31"
    assert lines[1].startswith("11."), lines[1]
    assert lines[2:5] == [BULLSEYE_MARKER, BULLSEYE_WORKDIR, "/usr/local/bin:/usr/bin:/bin"]
    assert lines[5:7] == ["no-python", "0"]
    assert "version 5.1." in lines[7], lines[7]  # bullseye's own bash
    assert lines[8] == "old but gold"

    patch = "--- a/README\n+++ b/README\n@@ -1 +1 @@\n-old but gold\n+old, patched\n"
    response = call(
        served, lease_id, "POST", "/evaluate", json={"patch": patch, "shell": "grep -q patched README"}
    )
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["patch"] == {"applied": True, "files": ["README"]}
    assert (report["outcome"], report["reward"]) == ("passed", 1.0), report
    written = call(served, lease_id, "PUT", "/files", params={"path": "out.txt"}, content=b"bullseye\n")
    assert written.status_code in (200, 201, 204), written.text
    assert shell(served, lease_id, f"cat {BULLSEYE_WORKDIR}/out.txt")["stdout"] == "bullseye\n"


def test_the_cli_leases_and_runs_in_every_foreign_image(served: Served) -> None:
    """`sandfleet lease --image TAG`, `exec`, `release`: the CLI a user types, on each image."""
    env = {**os.environ, "SANDFLEET_URL": served.url, "SANDFLEET_TOKEN": "local-token"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sandfleet.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )

    for image in served.images:
        leased = cli("lease", "python", "--image", image, "--wait", "120")
        assert leased.returncode == 0, leased.stderr
        lease_id = leased.stdout.strip()
        try:
            # distroless has no shell: its one program, found on the image's own PATH.
            command = ["busybox", "echo", "ok"] if image == "distroless" else ["sh", "-c", "echo ok"]
            ran = cli("exec", lease_id, "--", *command)
            assert (ran.returncode, ran.stdout) == (0, "ok\n"), (image, ran.stdout, ran.stderr)
        finally:
            released = cli("release", lease_id)
            assert released.returncode == 0, released.stderr


async def test_cold_start_of_an_injected_image_against_sandfleets_own(
    runsc: Path, base_image: ImageRef, foreign: dict[str, ImageRef]
) -> None:
    """Boot, one at a time, sandboxes of busybox (injected) and of sandfleet's image, interleaved."""
    rounds = 5
    seconds: dict[str, list[float]] = {"sandfleet": [], "busybox": [], "sandfleet-injected": []}
    async with (
        LocalRuntime(base_image, runsc) as runtime,
        LocalRuntime(base_image, runsc, inject_all=True) as injected,
    ):
        await runtime.add_image(foreign["busybox"])
        for _ in range(rounds):
            for name, owner, spec in (
                ("sandfleet", runtime, SandboxSpec()),
                ("busybox", runtime, SandboxSpec(image=foreign["busybox"])),
                ("sandfleet-injected", injected, SandboxSpec()),
            ):
                sandbox = await owner.create(spec)
                seconds[name].append(sandbox.timings["total_s"])
                await owner.destroy(sandbox)
                await asyncio.sleep(0.2)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    print(
        "cold start medians of "
        + str(rounds)
        + ": "
        + ", ".join(f"{name} {median:.3f} s" for name, median in medians.items())
        + f"; busybox/sandfleet {medians['busybox'] / medians['sandfleet']:.2f}"
    )
    assert all(median < 10 for median in medians.values()), seconds


async def test_an_injected_sandbox_is_snapshotted_restored_and_reset(
    runsc: Path, base_image: ImageRef, foreign: dict[str, ImageRef]
) -> None:
    """Recycling pools restore golden snapshots: the bundle's mount comes back with them."""
    spec = SandboxSpec(image=foreign["busybox"])
    async with LocalRuntime(base_image, runsc) as runtime:
        await runtime.add_image(foreign["busybox"])
        sandbox = await runtime.create_restored(spec)
        async with httpx.AsyncClient(base_url=sandbox.url, headers=sandbox.headers, trust_env=False) as agent:
            ran = await agent.post("/v1/exec", json={"shell": "pwd; echo dirty > left.txt"}, timeout=60)
            assert ran.json()["stdout"] == f"{BUSYBOX_WORKDIR}\n", ran.text
        golden = await runtime.golden(spec)
        await runtime.reset(sandbox, golden, "next-episode")
        async with httpx.AsyncClient(base_url=sandbox.url, headers=sandbox.headers, trust_env=False) as agent:
            after = await agent.post("/v1/exec", json={"shell": "ls left.txt 2>&1; echo $MARKER"}, timeout=60)
            assert "No such file" in after.json()["stdout"], after.text
            assert after.json()["stdout"].endswith(f"{BUSYBOX_MARKER}\n")
        await runtime.destroy(sandbox)
