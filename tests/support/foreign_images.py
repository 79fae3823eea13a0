"""Tiny OCI images sandfleet did not make, built offline from Debian packages with umoci (no registry).

- `busybox`: Debian's busybox-static as /bin/busybox with its applets, an /etc/passwd whose one
  user squats the first uid the runtime would pick for its agent, and an image config with its own
  PATH, a variable and a WorkingDir.
- `musl`: an Alpine-style root: musl's libc as /lib/ld-musl-x86_64.so.1, busybox-static, no glibc.
- `distroless`: one static binary (busybox, at /app/busybox), no /bin/sh, no /etc at all.

Each is cached under ~/.cache/sandfleet/foreign-images/<name>-<key>/layout, keyed by the packages'
versions and this file. Needs root (umoci unpack keeps owners) and apt's package lists.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from sandfleet.local.artifacts import ImageRef, image_ref_from_layout
from sandfleet.local.image import rootfs_cache
from sandfleet.local.injection import AGENT_ID_BASE

BUSYBOX_PATH = "/opt/tools/bin:/usr/bin:/bin"
BUSYBOX_WORKDIR = "/srv/work"
BUSYBOX_MARKER = "from-the-image"
# The image's own user with the first id the runtime would otherwise give the agent's exec user.
SQUATTER_ID = AGENT_ID_BASE
MUSL_LOADER = "/lib/ld-musl-x86_64.so.1"
IMAGES = ("busybox", "musl", "distroless")


def _cache() -> Path:
    return rootfs_cache().parent / "foreign-images"


def _run(argv: list[str], cwd: Path | None = None) -> str:
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr[-2000:]}")
    return result.stdout


def _versions(packages: tuple[str, ...]) -> dict[str, str]:
    out = _run(["apt-cache", "policy", *packages])
    versions: dict[str, str] = {}
    current = ""
    for line in out.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1]
        elif line.strip().startswith("Candidate:"):
            versions[current] = line.split(":", 1)[1].strip()
    return versions


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    _cache().mkdir(parents=True, exist_ok=True)
    fd = os.open(_cache() / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _extract(packages: tuple[str, ...], versions: dict[str, str], into: Path, work: Path) -> None:
    debs = work / "debs"
    debs.mkdir(exist_ok=True)
    _run(["apt-get", "download", *(f"{p}={versions[p]}" for p in packages)], cwd=debs)
    for deb in sorted(debs.glob("*.deb")):
        _run(["dpkg-deb", "-x", str(deb), str(into)])
    shutil.rmtree(debs)


def _busybox_applets(rootfs: Path, directory: str = "bin") -> None:
    """Links for every applet of /bin/busybox (listed by running it: it is static)."""
    applets = _run([str(rootfs / "bin" / "busybox"), "--list"]).split()
    for applet in applets:
        link = rootfs / directory / applet
        if applet != "busybox" and not link.exists():
            link.symlink_to("/bin/busybox")


def _populate(name: str, rootfs: Path, work: Path, versions: dict[str, str]) -> dict[str, list[str]]:
    """Fill the rootfs; return the config's settings (umoci config flags by name)."""
    staging = work / "staging"
    if name == "busybox":
        _extract(("busybox-static",), versions, staging, work)
        (rootfs / "bin").mkdir()
        shutil.copy2(staging / "bin" / "busybox", rootfs / "bin" / "busybox")
        _busybox_applets(rootfs)
        (rootfs / "etc").mkdir()
        (rootfs / "etc" / "passwd").write_text(
            f"root:x:0:0:root:/root:/bin/sh\nsquatter:x:{SQUATTER_ID}:{SQUATTER_ID}::/home/squatter:/bin/sh\n"
        )
        (rootfs / "etc" / "group").write_text(f"root:x:0:\nsquatter:x:{SQUATTER_ID}:\n")
        (rootfs / BUSYBOX_WORKDIR.lstrip("/")).mkdir(parents=True)
        (rootfs / BUSYBOX_WORKDIR.lstrip("/") / "hello.txt").write_text("hello from the image\n")
        (rootfs / "opt" / "tools" / "bin").mkdir(parents=True)
        return {
            "env": [f"PATH={BUSYBOX_PATH}", f"MARKER={BUSYBOX_MARKER}"],
            "workingdir": [BUSYBOX_WORKDIR],
            "cmd": ["/bin/sh"],
        }
    if name == "musl":
        _extract(("busybox-static", "musl"), versions, staging, work)
        for directory in ("bin", "lib", "etc", "root", "tmp"):
            (rootfs / directory).mkdir()
        shutil.copy2(staging / "bin" / "busybox", rootfs / "bin" / "busybox")
        _busybox_applets(rootfs)
        # As Alpine has it: musl's libc is its dynamic loader too.
        shutil.copy2(staging / "lib" / "x86_64-linux-musl" / "libc.so", rootfs / MUSL_LOADER.lstrip("/"))
        (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (rootfs / "etc" / "os-release").write_text("ID=musl-test\nNAME=musl and busybox\n")
        return {
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cmd": ["/bin/sh"],
        }
    if name == "distroless":
        _extract(("busybox-static",), versions, staging, work)
        (rootfs / "app").mkdir()
        shutil.copy2(staging / "bin" / "busybox", rootfs / "app" / "busybox")
        return {"env": ["PATH=/app"], "workingdir": ["/app"], "entrypoint": ["/app/busybox"]}
    raise ValueError(f"unknown image {name!r}")


def build_foreign_image(name: str) -> ImageRef:
    """The image `name` (one of IMAGES) as an OCI layout, built once and cached."""
    packages = ("busybox-static", "musl") if name == "musl" else ("busybox-static",)
    with _locked():
        versions = _versions(packages)
        inputs = [name, sorted(versions.items()), hashlib.sha256(Path(__file__).read_bytes()).hexdigest()]
        key = hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:12]
        final = _cache() / f"{name}-{key}"
        if (final / "layout" / "index.json").is_file():
            return image_ref_from_layout(f"{final / 'layout'}:{name}")
        work = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=_cache()))
        try:
            layout, bundle = work / "layout", work / "bundle"
            image = f"{layout}:{name}"
            _run(["umoci", "init", "--layout", str(layout)])
            _run(["umoci", "new", "--image", image])
            _run(["umoci", "unpack", "--image", image, str(bundle)])
            settings = _populate(name, bundle / "rootfs", work, versions)
            _run(["umoci", "repack", "--image", image, str(bundle)])
            flags = ["--clear=config.env", "--clear=config.entrypoint", "--clear=config.cmd"]
            for setting, values in settings.items():
                flags += [f"--config.{setting}={value}" for value in values]
            _run(["umoci", "config", "--image", image, *flags])
            _run(["umoci", "gc", "--layout", str(layout)])
            shutil.rmtree(bundle)
            shutil.rmtree(work / "staging", ignore_errors=True)
            shutil.rmtree(final, ignore_errors=True)
            work.rename(final)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        return image_ref_from_layout(f"{final / 'layout'}:{name}")
