"""OCI images sandfleet did not make, built offline from Debian packages with umoci (no registry).

- `busybox`: Debian's busybox-static as /bin/busybox with its applets, an /etc/passwd whose one
  user squats the first uid the runtime would pick for its agent, and an image config with its own
  PATH, a variable and a WorkingDir.
- `musl`: an Alpine-style root: musl's libc as /lib/ld-musl-x86_64.so.1, busybox-static, no glibc.
- `distroless`: one static binary (busybox, at /app/busybox), no /bin/sh, no /etc at all.
- `bullseye`: an older distribution, Debian 11 `--variant=minbase` made by mmdebstrap from the
  Debian mirror: glibc 2.31, bash, apt, no python; its own Env and WorkingDir (32 MB gzipped);
  a setuid-root copy of GNU `id` as BULLSEYE_SETUID_ID.
- `build_conda_image()`, the benchmark's (bench/image_cold_start.py), not a test's: 1.0 GB of Debian
  bookworm and a conda-style /opt/conda of PyPI wheels, keyed by its own inputs.

Each is cached under ~/.cache/sandfleet/foreign-images/<name>-<key>/layout, keyed by the packages'
versions (for bullseye: the suite, variant, mirror and options) and this file. Needs root (umoci
unpack keeps owners), apt's package lists and, for bullseye, the mirror
($SANDFLEET_DEBIAN_MIRROR, else deb.debian.org).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
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
BULLSEYE_GLIBC = "2.31"
BULLSEYE_WORKDIR = "/opt/legacy"
BULLSEYE_MARKER = "debian-11"
# A setuid-root copy of GNU `id` in the bullseye image: what it says under a non-root command is
# whether a setuid program gets root there (it must not: no_new_privs, or the runtime clearing it).
BULLSEYE_SETUID_ID = "/usr/local/bin/euid"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Small: no docs, manuals or translations (what a slim base image drops too).
BULLSEYE_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*")
IMAGES = ("busybox", "musl", "distroless", "bullseye")
# The benchmark's large image (build_conda_image); bump CONDA_BUILDER when its build changes.
CONDA_BUILDER = 2
CONDA_PREFIX = "/opt/conda"
CONDA_REQUIREMENTS = (
    "numpy==2.4.6", "scipy==1.17.1", "pandas==3.1.1", "pyarrow==26.0.1", "scikit-learn==1.9.1",
    "matplotlib==3.11.2", "sympy==1.14.0", "statsmodels==0.15.0", "plotly==7.1.0",
)  # fmt: skip


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


def mirror() -> str:
    """The Debian mirror the bullseye image comes from."""
    return os.environ.get("SANDFLEET_DEBIAN_MIRROR") or DEFAULT_MIRROR


def _empty_dev(rootfs: Path) -> None:
    """Drop the device nodes mmdebstrap made: an image ships an empty /dev (the runtime gives its own)."""
    for entry in (rootfs / "dev").iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _bullseye(rootfs: Path) -> dict[str, list[str]]:
    """Debian 11 minbase into the (empty) rootfs: glibc 2.31, no python."""
    # mmdebstrap wants to create its target itself (or find it empty): umoci made it empty.
    _run([
        "mmdebstrap", "--variant=minbase", "--mode=root", "--quiet",
        *(f"--dpkgopt=path-exclude={pattern}" for pattern in BULLSEYE_EXCLUDES),
        '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/*.log',
        f'--customize-hook=mkdir -p "$1"{BULLSEYE_WORKDIR}',
        f"--customize-hook=echo 'old but gold' > \"$1\"{BULLSEYE_WORKDIR}/README",
        f'--customize-hook=install -o root -g root -m 4755 "$1"/usr/bin/id "$1"{BULLSEYE_SETUID_ID}',
        "bullseye", str(rootfs), mirror(),
    ])  # fmt: skip
    _empty_dev(rootfs)
    return {
        "env": ["PATH=/usr/local/bin:/usr/bin:/bin", f"MARKER={BULLSEYE_MARKER}", "LANG=C.UTF-8"],
        "workingdir": [BULLSEYE_WORKDIR],
        "cmd": ["/bin/bash"],
    }


def _populate(name: str, rootfs: Path, work: Path, versions: dict[str, str]) -> dict[str, list[str]]:
    """Fill the rootfs; return the config's settings (umoci config flags by name)."""
    staging = work / "staging"
    if name == "bullseye":
        return _bullseye(rootfs)
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
    packages = {"musl": ("busybox-static", "musl"), "bullseye": ()}.get(name, ("busybox-static",))
    with _locked():
        versions = _versions(packages) if packages else {}
        origin: list[object] = ["bullseye", "minbase", mirror()] if name == "bullseye" else []
        this_file = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
        inputs: list[object] = [name, sorted(versions.items()), origin, this_file]
        return _build(name, inputs, lambda rootfs, work: _populate(name, rootfs, work, versions))


def build_conda_image() -> ImageRef:
    """The benchmark's large image (1.1 GB unpacked, 32 000 files; 300 MB gzipped), built once (minutes).

    Debian bookworm minbase with python3, and a conda-style environment in /opt/conda: a venv on
    Debian's python 3.11 with real wheels from PyPI (CONDA_REQUIREMENTS and what they pull),
    byte-compiled as conda does when it links a package. Keyed by its own inputs, not this file, so
    an edit here does not rebuild a gigabyte.
    """
    with _locked():
        inputs: list[object] = [
            "conda",
            CONDA_BUILDER,
            CONDA_REQUIREMENTS,
            "bookworm",
            mirror(),
            sys.version_info[:2],
        ]
        return _build("conda", inputs, _conda)


def _conda(rootfs: Path, work: Path) -> dict[str, list[str]]:
    _run([
        "mmdebstrap", "--variant=minbase", "--mode=root", "--quiet", "--include=python3",
        *(f"--dpkgopt=path-exclude={pattern}" for pattern in BULLSEYE_EXCLUDES),
        '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/*.log',
        "bookworm", str(rootfs), mirror(),
    ])  # fmt: skip
    _empty_dev(rootfs)
    prefix = rootfs / CONDA_PREFIX.lstrip("/")
    site = prefix / "lib" / "python3.11" / "site-packages"
    # The image's python is 3.11: pick its wheels, not the host's (which is 3.11 too, for compileall).
    _run([
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
        "--target", str(site), "--only-binary=:all:", "--python-version", "3.11", "--implementation",
        "cp", "--abi", "cp311", *(f"--platform=manylinux_2_{minor}_x86_64" for minor in (17, 28, 34)),
        "--platform=manylinux2014_x86_64", "--cache-dir", str(rootfs_cache().parent / "pip"),
        *CONDA_REQUIREMENTS,
    ])  # fmt: skip
    # Console scripts name the build host's python; the environment's own bin/ is made below.
    shutil.rmtree(site / "bin", ignore_errors=True)
    _run([
        sys.executable, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash",
        "-s", str(rootfs), "-p", "/", str(site),
    ])  # fmt: skip
    (prefix / "bin").mkdir()
    (rootfs / "home" / "analysis").mkdir(parents=True, exist_ok=True)
    (prefix / "bin" / "python").symlink_to("/usr/bin/python3.11")
    (prefix / "bin" / "python3").symlink_to("python")
    (prefix / "pyvenv.cfg").write_text(
        "home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11\n"
    )
    return {
        "env": [f"PATH={CONDA_PREFIX}/bin:/usr/local/bin:/usr/bin:/bin", f"CONDA_PREFIX={CONDA_PREFIX}"],
        "workingdir": ["/home/analysis"],
        "cmd": ["/bin/bash"],
    }


def _build(
    name: str, inputs: list[object], populate: Callable[[Path, Path], dict[str, list[str]]]
) -> ImageRef:
    """Build (under the lock) or find the cached layout of `name`, keyed by `inputs`."""
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
        settings = populate(bundle / "rootfs", work)
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
