"""Bad images on the local runtime, which unpacks as root on the host: refused, or made harmless.

Each hostile image is written entry by entry (tests/support/hostile_images.py) and goes through the
real path: `ensure_rootfs` (the layer checks, then umoci) and, for some, `serve --local --image`.
What its entries aim at (a sentinel directory, /etc, /tmp, /root) is listed before and after:
nothing may change outside the image's own directory in the rootfs cache.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sandfleet.local.artifacts import ImageRef
from sandfleet.local.errors import (
    ImageConfigError,
    ImageLayerError,
    ImageSourceError,
    ImageTooLargeError,
)
from sandfleet.local.image import ensure_rootfs, rootfs_cache, scan_layers
from sandfleet.local.layers import LayerLimits
from sandfleet.local.runtime import LocalRuntime, SandboxSpec
from tests.support.foreign_images import build_foreign_image
from tests.support.hostile_images import (
    HostSnapshot,
    Layer,
    Member,
    names_containing,
    rebase_image,
    write_image,
)

pytestmark = pytest.mark.gvisor

# Where an escape would land, besides the sentinel: listed by name (other jobs write here too).
WATCHED = (Path("/tmp"), Path("/root"), Path("/etc"))
DEEP = 24  # enough `../` to climb from any cache directory to the host's root


@dataclass(frozen=True)
class Host:
    """A sentinel directory the hostile entries aim at, and the unique name they try to create."""

    sentinel: Path
    token: str

    @property
    def up(self) -> str:
        return "../" * DEEP + str(self.sentinel).lstrip("/")

    def snapshot(self, cache: Path) -> HostSnapshot:
        return HostSnapshot.take([self.sentinel, Path("/etc"), cache])

    def escaped(self) -> list[str]:
        return names_containing(self.token, [*WATCHED, self.sentinel])


@pytest.fixture
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    token = f"sandfleet-escape-{secrets.token_hex(4)}"
    sentinel = Path("/tmp") / f"sandfleet-sentinel-{secrets.token_hex(4)}"
    sentinel.mkdir()
    (sentinel / "victim").write_text("the host's file\n")
    try:
        yield Host(sentinel, token)
    finally:
        shutil.rmtree(sentinel, ignore_errors=True)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A rootfs cache of this test's own (SANDFLEET_CACHE), so its listing is only this image's."""
    monkeypatch.setenv("SANDFLEET_CACHE", str(tmp_path / "cache"))
    rootfs_cache().mkdir(parents=True)
    return rootfs_cache()


def hostile_layers(kind: str, host: Host) -> list[Layer]:
    """The layers of one refused image: an ordinary first layer, then the hostile one."""
    t = host.token
    hostile = {
        "dotdot": [Member(f"{'../' * DEEP}tmp/{t}", data=b"escaped")],
        "dotdot-nested": [Member(f"usr/{'../' * DEEP}etc/{t}", data=b"escaped")],
        "dotdot-into-sentinel": [Member(f"{host.up}/{t}", data=b"escaped")],
        "hardlink-out": [Member(f"{t}-link", "hardlink", linkname=f"{host.up}/victim")],
        "whiteout-out": [Member(f"{host.up}/.wh.victim")],
        "whiteout-dotdot": [Member("etc/.wh...")],
        "char-device": [Member(f"dev/{t}-mem", "char", device=(1, 1), mode=0o666)],
        "block-device": [Member(f"{t}-disk", "block", device=(8, 0), mode=0o666)],
    }[kind]
    return [Layer([Member("etc", "dir", mode=0o755), Member("etc/hostname", data=b"ok\n")]), Layer(hostile)]


def _refused_leaves_nothing(
    host: Host, cache: Path, image: ImageRef, limits: LayerLimits
) -> ImageSourceError:
    before, escaped_before = host.snapshot(cache), host.escaped()
    with pytest.raises(ImageSourceError) as refused:
        asyncio.run(ensure_rootfs(image, limits))
    changes = before.changes(host.snapshot(cache))
    lock = str(cache / f"{image.digest.replace(':', '-')}.lock")
    assert changes == {"added": [lock], "removed": [], "changed": []}, changes  # only its lock file
    assert host.escaped() == escaped_before == []
    return refused.value


@pytest.mark.parametrize(
    ("kind", "fragment"),
    [
        ("dotdot", "climbs out of the image's root"),
        ("dotdot-nested", "climbs out of the image's root"),
        ("dotdot-into-sentinel", "climbs out of the image's root"),
        ("hardlink-out", "is a hard link to"),
        ("whiteout-out", "climbs out of the image's root"),
        ("whiteout-dotdot", "whiteout aimed at '..'"),
        ("char-device", "character device node"),
        ("block-device", "block device node"),
    ],
)
def test_a_hostile_layer_is_refused_before_umoci_and_the_host_is_as_it_was(
    kind: str, fragment: str, host: Host, cache: Path, tmp_path: Path
) -> None:
    image = write_image(tmp_path / "layout", kind, hostile_layers(kind, host))
    error = _refused_leaves_nothing(host, cache, image, LayerLimits())
    assert isinstance(error, ImageLayerError)
    assert fragment in str(error)
    assert image.digest in str(error)
    assert "layer sha256:" in str(error)


def test_a_decompression_bomb_is_refused_with_the_limit(host: Host, cache: Path, tmp_path: Path) -> None:
    image = write_image(
        tmp_path / "layout", "bomb", [Layer([Member(f"{host.token}-zeros", zeros=256 << 20)])]
    )
    blobs = sum(p.stat().st_size for p in (image.layout / "blobs" / "sha256").iterdir())
    started = time.perf_counter()
    error = _refused_leaves_nothing(host, cache, image, LayerLimits(max_bytes=32 << 20))
    seconds = time.perf_counter() - started
    assert isinstance(error, ImageTooLargeError)
    assert f"more than {32 << 20} bytes, the limit" in str(error)
    assert blobs < 1 << 20
    assert seconds < 10


def test_an_image_bigger_than_the_space_left_is_refused(host: Host, cache: Path, tmp_path: Path) -> None:
    image = write_image(tmp_path / "layout", "big", [Layer([Member(f"{host.token}-data", zeros=8 << 20)])])
    free = shutil.disk_usage(cache).free
    # A reserve of all but 4 MiB of what is free: this 8 MiB image cannot fit (the disk is not filled).
    error = _refused_leaves_nothing(host, cache, image, LayerLimits(disk_reserve_bytes=free - (4 << 20)))
    assert isinstance(error, ImageTooLargeError)
    assert "are free on the rootfs cache's filesystem" in str(error)
    assert "about 8388608 bytes" in str(error)


def test_links_aimed_at_the_host_are_followed_inside_the_rootfs_only(
    host: Host, cache: Path, tmp_path: Path
) -> None:
    """Absolute and climbing symlinks are let through; every entry through them lands in the rootfs."""
    t, sentinel = host.token, str(host.sentinel).lstrip("/")
    layers = [
        Layer(
            [
                Member("escape", "symlink", linkname=str(host.sentinel)),  # absolute, to the host's dir
                Member(f"escape/{t}-abs", data=b"through an absolute link"),
                Member("escape/victim", data=b"the image's victim"),
                Member(f"{t}-hardlink", "hardlink", linkname="escape/victim"),
                Member("root", "symlink", linkname="/"),
                Member(f"root/{sentinel}/{t}-root", data=b"through a link to /"),
                Member("up", "symlink", linkname="../" * DEEP + sentinel),
                Member(f"up/{t}-up", data=b"through a climbing link"),
                Member("hostetc", "symlink", linkname="/etc"),
                Member(f"hostetc/{t}", data=b"into etc"),
                Member("usr/bin/su", data=b"#!/bin/sh\n", mode=0o4755),
                Member("usr/bin/wall", data=b"#!/bin/sh\n", mode=0o2755),
            ]
        ),
        Layer([Member("escape/.wh.victim"), Member("up/.wh.victim")]),  # whiteouts through the links
    ]
    image = write_image(
        tmp_path / "layout", "links", layers, {"Cmd": ["/bin/sh"], "WorkingDir": "/escape/work"}
    )
    before, escaped_before = host.snapshot(cache), host.escaped()
    rootfs = asyncio.run(ensure_rootfs(image))
    assert host.escaped() == escaped_before == []
    changes = before.changes(host.snapshot(cache))
    image_dir = str(rootfs.parent)
    outside = [
        p for kind in changes.values() for p in kind if not p.startswith((image_dir, f"{image_dir}.lock"))
    ]
    assert outside == [], changes
    # Each entry went where the link points when read inside the image's root.
    inside = rootfs / sentinel
    assert (inside / f"{t}-abs").read_bytes() == b"through an absolute link"
    assert (inside / f"{t}-root").read_bytes() == b"through a link to /"
    assert (inside / f"{t}-up").read_bytes() == b"through a climbing link"
    assert (rootfs / "etc" / t).read_bytes() == b"into etc"
    assert not (inside / "victim").exists()  # whited out inside; the host's is untouched:
    assert (host.sentinel / "victim").read_text() == "the host's file\n"
    assert (rootfs / f"{t}-hardlink").read_bytes() == b"the image's victim"
    assert os.stat(rootfs / f"{t}-hardlink").st_ino != os.stat(host.sentinel / "victim").st_ino
    # setuid and setgid bits are cleared; the directory holding the rootfs is root's alone.
    assert stat.S_IMODE((rootfs / "usr/bin/su").stat().st_mode) == 0o755
    assert stat.S_IMODE((rootfs / "usr/bin/wall").stat().st_mode) == 0o755
    assert stat.S_IMODE(rootfs.parent.stat().st_mode) == 0o700


@pytest.mark.parametrize(
    ("workdir", "fragment"),
    [
        ("/etc/hostname", "which is not a directory"),
        ("/etc/hostname/sub", "goes through /etc/hostname, which is not a directory"),
        ("/srv/../etc", "has '..' in it"),
        ("/loop/work", "more than 40 links"),
    ],
)
def test_a_working_dir_that_cannot_be_one_is_refused(
    workdir: str, fragment: str, host: Host, cache: Path, tmp_path: Path
) -> None:
    layers = [
        Layer(
            [
                Member("etc/hostname", data=b"x\n"),
                Member("loop", "symlink", linkname="/loop"),
                Member("hostdir", "symlink", linkname=str(host.sentinel)),
            ]
        )
    ]
    image = write_image(tmp_path / "layout", "wd", layers, {"Cmd": ["/bin/sh"], "WorkingDir": workdir})
    before = HostSnapshot.take([host.sentinel, Path("/etc")])
    with pytest.raises(ImageConfigError, match=fragment):
        asyncio.run(ensure_rootfs(image))
    assert before.changes(HostSnapshot.take([host.sentinel, Path("/etc")])) == {
        "added": [],
        "removed": [],
        "changed": [],
    }


def _serve(image: ImageRef, environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandfleet.cli", "serve", "--local", "--warm", "1", "--port", "1",
         "--image", f"{image.layout}:{image.tag}"],
        capture_output=True, text=True, timeout=300, env={**os.environ, **environment},
    )  # fmt: skip


def test_serve_refuses_bad_images_in_one_line(host: Host, tmp_path: Path) -> None:
    """Through the real `serve --local` (its own rootfs cache, as a user has it): exit 1, no traceback."""
    device = write_image(tmp_path / "device", "device", hostile_layers("char-device", host))
    bomb = write_image(tmp_path / "bomb", "bomb", [Layer([Member("zeros", zeros=64 << 20)])])
    cache = rootfs_cache()  # the shared one: listed by name only (other jobs may unpack there)
    before, cached_before, escaped_before = (
        HostSnapshot.take([host.sentinel, Path("/etc")]),
        set(os.listdir(cache)),
        host.escaped(),
    )
    refused = _serve(device, {})
    assert refused.returncode == 1, refused.stderr[-3000:]
    lines = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, refused.stderr
    assert "character device node" in lines[0], lines
    assert device.digest in lines[0], lines
    assert "Traceback" not in refused.stderr + refused.stdout
    limit = 16 << 20
    too_big = _serve(bomb, {"SANDFLEET_LOCAL_MAX_IMAGE_BYTES": str(limit)})
    assert too_big.returncode == 1, too_big.stderr[-3000:]
    assert f"more than {limit} bytes, the limit" in too_big.stderr
    assert "Traceback" not in too_big.stderr + too_big.stdout
    bad_setting = _serve(bomb, {"SANDFLEET_LOCAL_MAX_IMAGE_BYTES": "lots"})
    assert bad_setting.returncode == 2
    assert "SANDFLEET_LOCAL_MAX_IMAGE_BYTES" in bad_setting.stderr
    assert host.escaped() == escaped_before == []
    assert before.changes(HostSnapshot.take([host.sentinel, Path("/etc")])) == {
        "added": [],
        "removed": [],
        "changed": [],
    }
    for image in (device, bomb):  # nothing of either image in the cache but its lock file
        name = image.digest.replace(":", "-")
        assert {n for n in set(os.listdir(cache)) - cached_before if name in n} <= {f"{name}.lock"}


async def test_an_image_env_that_would_break_the_agent_does_not(
    runsc: Path, base_image: ImageRef, tmp_path: Path
) -> None:
    """LD_PRELOAD, LD_LIBRARY_PATH and PATH set to break things: the agent boots, exec and evaluate work.

    The commands see the image's values; the working directory does not exist in the image (the
    agent makes it, as runc would); the image's setuid file lost its bit.
    """
    busybox = build_foreign_image("busybox")
    env = ["LD_PRELOAD=/nonexistent.so", "LD_LIBRARY_PATH=/nowhere/lib", "PATH=/nowhere", "MARKER=broken-env"]
    image = rebase_image(
        busybox,
        tmp_path / "layout",
        "broken-env",
        {"Env": env, "WorkingDir": "/srv/missing/work", "Cmd": ["/bin/sh"]},
        [Layer([Member("opt/suid/tool", data=b"#!/bin/sh\n/bin/id -u\n", mode=0o4755)])],
    )
    async with LocalRuntime(base_image, runsc) as runtime:
        await runtime.add_image(image)
        sandbox = await runtime.create(SandboxSpec(image=image))
        async with httpx.AsyncClient(
            base_url=sandbox.url, headers=sandbox.headers, timeout=60, trust_env=False
        ) as agent:
            ran = await agent.post(
                "/v1/exec",
                json={"shell": "echo $LD_PRELOAD; echo $LD_LIBRARY_PATH; echo $PATH; pwd; "
                      "/bin/stat -c %a /opt/suid/tool; /bin/id -u; echo made > here.txt"},
            )  # fmt: skip
            assert ran.status_code == 200, ran.text
            result = ran.json()
            assert result["exit_code"] == 0, result
            lines = result["stdout"].splitlines()
            assert lines[:5] == ["/nonexistent.so", "/nowhere/lib", "/nowhere", "/srv/missing/work", "755"]
            assert int(lines[5]) != 0
            patch = "--- /dev/null\n+++ b/patched.txt\n@@ -0,0 +1 @@\n+patched\n"
            evaluated = await agent.post(
                "/v1/evaluate", json={"patch": patch, "argv": ["/bin/grep", "-q", "patched", "patched.txt"]}
            )
            assert evaluated.status_code == 200, evaluated.text
            assert evaluated.json()["reward"] == 1.0, evaluated.json()
            read = await agent.get("/v1/files", params={"path": "here.txt"})
            assert read.status_code == 200
            assert read.content == b"made\n"
        await runtime.destroy(sandbox)


def test_the_checks_cost_against_umoci_on_the_base_image(base_image: ImageRef, tmp_path: Path) -> None:
    """The scan reads every layer once; umoci then unpacks them. Median of 3, same run."""
    scans, unpacks = [], []
    for round_ in range(3):
        started = time.perf_counter()
        scan_layers(base_image, LayerLimits())
        scans.append(time.perf_counter() - started)
        target = tmp_path / f"unpack-{round_}"
        started = time.perf_counter()
        subprocess.run(["umoci", "raw", "unpack", "--image", base_image.layout_ref, str(target)], check=True)
        unpacks.append(time.perf_counter() - started)
        shutil.rmtree(target)
    scan_s, unpack_s = sorted(scans)[1], sorted(unpacks)[1]
    print(
        f"\nbase image: scan {scan_s:.3f} s, umoci raw unpack {unpack_s:.3f} s, ratio {scan_s / unpack_s:.2f}"
    )
    assert scan_s < 3 * unpack_s


def test_serve_refuses_a_user_the_image_does_not_name_in_one_line(
    base_image: ImageRef, tmp_path: Path
) -> None:
    """With --commands-as-image-user, a config `User` its /etc/passwd lacks stops serve before it starts."""
    ghost = rebase_image(
        base_image, tmp_path / "ghost", "ghost", {"User": "ghost", "WorkingDir": "/workspace"}
    )
    refused = subprocess.run(
        [sys.executable, "-m", "sandfleet.cli", "serve", "--local", "--warm", "1", "--port", "1",
         "--commands-as-image-user", "--image", f"{ghost.layout}:{ghost.tag}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert refused.returncode == 1, refused.stderr[-3000:]
    lines = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, refused.stderr
    assert "'ghost'" in lines[0], lines
    assert "/etc/passwd" in lines[0], lines
    assert "Traceback" not in refused.stderr + refused.stdout
