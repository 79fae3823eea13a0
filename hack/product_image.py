"""Builds the sandfleet product image (operator, gateway, RL actor and learner) offline, cached by inputs.

One image, `localhost/sandfleet/sandfleet:<version>`, runs every sandfleet Deployment: a minimal
Debian bookworm rootfs with python3 (3.11), the runtime dependencies pinned in
hack/product-image.lock under /opt/sandfleet/deps, and the sandfleet wheel built from this checkout
under /opt/sandfleet/app, run as uid 10001 with `sandfleet` as the entrypoint. It is built the way
sandbox_image/image_builder.py builds the sandbox image (mmdebstrap, then umoci; no registry, no
Docker) and reuses its steps. Three layers, each cached by the inputs below it: the Debian rootfs,
the dependencies (keyed by the lock), and sandfleet itself (keyed by the sources), so an edit under
operator/ rebuilds only the top layer. The result lands in ~/.cache/sandfleet/images/product-<key>/
as an OCI layout plus an oci-archive for `ctr -n k8s.io images import`. Run through
`hack/product-image`; building needs root.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The sandbox image's builder owns the shared steps (cache, mmdebstrap runner, umoci, archive).
sys.path.insert(0, str(REPO / "sandbox_image"))
import image_builder as ib  # noqa: E402

# Bump when a step changes in a way the explicit inputs below do not capture.
PRODUCT_BUILDER_VERSION = "1"
REPOSITORY = "localhost/sandfleet/sandfleet"
DEPS_TAG = "deps"
LOCK_NAME = "hack/product-image.lock"
# What the sandfleet wheel is built from (pyproject's packages.find also picks up the agent).
# tasks/: the task catalogues the RL actor and learner read (SANDFLEET_TASKS names the default).
SOURCES = ("pyproject.toml", "README.md", "operator", "sandbox_image/sandfleet_agent", "tasks")
# Pins the image takes from pyproject's extras as well, by extra and package name (the version stays
# pinned in pyproject only): the gateway's E2B envd routes serve with the e2b SDK's own Connect
# definitions (sandfleet.gateway.routes.e2b_envd), so without it a chart's gateway has no envd.
IMAGE_EXTRAS = (("integrations", "e2b"),)
# python3 and the one system library manylinux wheels may need beyond the essential set (numpy
# links libstdc++); no apt, no perl, no compilers. certifi (a dependency) carries the CA bundle.
PACKAGES = ("python3", "libstdc++6")
VARIANT = "essential"
# bookworm's python3 is 3.11 on glibc 2.36: the wheels must be cp311 (or abi3) for manylinux <= 2.36.
PYTHON_VERSION = "3.11"
GLIBC = (2, 36)
USER = "sandfleet"
UID = 10001
HOME = f"/home/{USER}"
PREFIX = "/opt/sandfleet"
DEPS_DIR = f"{PREFIX}/deps"
APP_DIR = f"{PREFIX}/app"
TASKS_DIR = f"{PREFIX}/tasks"
# Debian's python3 reads .pth files here: both directories land on sys.path for every python3 run,
# so the launcher, `python3 -c ...` and `kubectl exec ... python3` all see the same packages.
PTH_FILE = f"/usr/local/lib/python{PYTHON_VERSION}/dist-packages/sandfleet.pth"
LAUNCHER = "/usr/local/bin/sandfleet"
ENTRYPOINT = (LAUNCHER,)
CMD = ("--help",)
# Removed from the dependency layer: console scripts carry the build host's python in their shebang,
# and numpy's test suites are dead weight in a service image.
DEPS_PRUNE = ("bin", "numpy/**/tests")
DEFAULT_SOURCE = "https://github.com/sandfleet/sandfleet"
# Older product images kept in the cache after a new one is built (switching branches stays warm).
KEEP_PRODUCTS = 3


@dataclass(frozen=True)
class ProductImage:
    """A built product image: the shared BuiltImage plus what a cluster import needs."""

    image: ib.BuiltImage
    ref: str
    version: str
    revision: str
    archive_bytes: int
    unpacked_bytes: int
    deps_key: str

    def to_json(self) -> dict[str, object]:
        """The result as printed with --json (and stored as product.json)."""
        return {
            **self.image.to_json(),
            "ref": self.ref,
            "version": self.version,
            "revision": self.revision,
            "archive_bytes": self.archive_bytes,
            "unpacked_bytes": self.unpacked_bytes,
            "deps_key": self.deps_key,
        }


@dataclass(frozen=True)
class Project:
    """What pyproject.toml says about the package the image carries."""

    version: str
    dependencies: tuple[str, ...]


def read_project(repo: Path = REPO) -> Project:
    """The version and the runtime dependencies: [project] dependencies, plus the IMAGE_EXTRAS pins."""
    data = tomllib.loads((repo / "pyproject.toml").read_text())
    project = data["project"]
    extras = project.get("optional-dependencies", {})
    picked = []
    for extra, name in IMAGE_EXTRAS:
        found = [line for line in extras.get(extra, []) if requirement_name(line) == name]
        if len(found) != 1:
            raise ib.BuildError(f"pyproject.toml's {extra!r} extra must list {name!r} once (found {found})")
        picked.append(found[0])
    return Project(version=str(project["version"]), dependencies=(*project["dependencies"], *picked))


def requirement_name(requirement: str) -> str:
    """A requirement's project name, normalized (PEP 503): `E2B_x[extra]==1` is `e2b-x`."""
    name = re.split(r"[\s\[<>=!~;@(]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def image_ref(version: str) -> str:
    """The image reference, also the tag in the OCI layout so `ctr import` names it by itself."""
    return f"{REPOSITORY}:{version}"


def machine() -> str:
    """The host's machine name as wheel tags spell it (the image is built for the host's arch)."""
    return platform.machine()


def platform_tags(arch: str, glibc: tuple[int, int] = GLIBC) -> list[str]:
    """Every manylinux tag bookworm's glibc runs: pip does not widen an explicit --platform itself."""
    major, newest = glibc
    tags = [f"manylinux_{major}_{minor}_{arch}" for minor in range(newest, 4, -1)]
    legacy = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}
    tags += [f"{name}_{arch}" for name, minor in legacy.items() if arch in ("x86_64", "i686") or minor >= 17]
    return tags


def pip_target_options(arch: str) -> list[str]:
    """The pip options that pick wheels for the image's python (cp311, manylinux) instead of the host's."""
    options = [
        "--only-binary=:all:",
        f"--python-version={PYTHON_VERSION}",
        "--implementation=cp",
        f"--abi=cp{PYTHON_VERSION.replace('.', '')}",
    ]
    return options + [f"--platform={tag}" for tag in platform_tags(arch)]


def lock_inputs(dependencies: Sequence[str], arch: str) -> str:
    """A digest of what the lock is resolved from; a lock made from other inputs is stale."""
    inputs: list[object] = [sorted(dependencies), arch, PYTHON_VERSION, list(GLIBC)]
    return hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:16]


def format_lock(report: dict[str, object], inputs: str, arch: str) -> str:
    """A requirements file with one pinned, hashed line per package from a `pip --report`."""
    lines = [
        "# The sandfleet product image's runtime dependencies: pyproject.toml [project] dependencies and",
        f"# {', '.join(f'{name} ({extra} extra)' for extra, name in IMAGE_EXTRAS)},",
        f"# resolved for CPython {PYTHON_VERSION} on manylinux {arch} (Debian bookworm, glibc "
        f"{GLIBC[0]}.{GLIBC[1]}).",
        "# Written by `hack/product-image lock` (the build rewrites it when those inputs change).",
        f"# inputs: {inputs}",
    ]
    installs = report.get("install")
    if not isinstance(installs, list) or not installs:
        raise ib.BuildError("pip's resolution report lists nothing to install")
    pins: list[str] = []
    for item in installs:
        metadata, download = item["metadata"], item["download_info"]
        digest = download["archive_info"]["hashes"]["sha256"]
        pins.append(f"{metadata['name'].lower()}=={metadata['version']} --hash=sha256:{digest}")
    return "\n".join([*lines, *sorted(pins)]) + "\n"


def lock_inputs_of(text: str) -> str | None:
    """The inputs digest a lock records, if it records one."""
    for line in text.splitlines():
        if line.startswith("# inputs: "):
            return line.removeprefix("# inputs: ").strip()
    return None


def resolve_lock(dependencies: Sequence[str], arch: str) -> str:
    """Resolve the dependencies on PyPI for the image's python and platform (needs the network)."""
    with tempfile.TemporaryDirectory(prefix="sandfleet-lock-") as scratch:
        report = Path(scratch) / "report.json"
        ib.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--dry-run",
                "--ignore-installed",
                "--report",
                str(report),
                "--target",
                str(Path(scratch) / "target"),
                *pip_target_options(arch),
                *dependencies,
            ],
            what="resolving the runtime dependencies (pip --dry-run)",
        )
        data = json.loads(report.read_text())
    return format_lock(data, lock_inputs(dependencies, arch), arch)


def current_lock(project: Project, arch: str, path: Path) -> str:
    """The lock's text, re-resolved first when pyproject's dependencies (or the arch) changed."""
    want = lock_inputs(project.dependencies, arch)
    text = path.read_text() if path.exists() else ""
    if lock_inputs_of(text) == want:
        return text
    ib.progress(f"{path.name} is missing or stale: resolving the runtime dependencies")
    text = resolve_lock(project.dependencies, arch)
    write_atomically(path, text)
    ib.progress(f"wrote {path}: commit it")
    return text


def write_atomically(path: Path, text: str) -> None:
    """Write a file so a concurrent reader sees the old or the new content, never a part."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.part")
    partial.write_text(text)
    partial.rename(path)


def source_digest(repo: Path = REPO) -> str:
    """A digest of everything the sandfleet wheel is built from (bytecode caches ignored)."""
    digest = hashlib.sha256()
    for name in SOURCES:
        path = repo / name
        if path.is_dir():
            digest.update(f"{name}/\0{ib.hash_tree(path)}\0".encode())
        elif path.exists():
            digest.update(f"{name}\0".encode() + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def revision(repo: Path = REPO) -> str:
    """The last commit that touched the sources, with -dirty when they differ from it."""
    try:
        commit = _git(repo, "log", "-1", "--format=%H", "--", *SOURCES)
        dirty = _git(repo, "status", "--porcelain", "--", *SOURCES)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    if not commit:
        return "unknown"
    return f"{commit}-dirty" if dirty else commit


def source_url(repo: Path = REPO) -> str:
    """Where the source lives: $SANDFLEET_IMAGE_SOURCE, else git's origin remote, else the project URL."""
    explicit = os.environ.get("SANDFLEET_IMAGE_SOURCE")
    if explicit:
        return explicit
    try:
        origin = _git(repo, "remote", "get-url", "origin")
    except (OSError, subprocess.CalledProcessError):
        origin = ""
    # A remote URL may carry credentials (https://user:token@host/...): never put them in a label.
    if origin and "@" not in origin.split("://", 1)[-1].split("/", 1)[0]:
        return origin
    return DEFAULT_SOURCE


def _git(repo: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, timeout=30
    )
    return result.stdout.strip()


def strip_available() -> bool:
    """Whether binutils' strip and readelf are here to drop debug info from extension modules."""
    return shutil.which("strip") is not None and shutil.which("readelf") is not None


def rootfs_key(mirror: str) -> str:
    """The cache key of the product's Debian rootfs tarball."""
    inputs: list[object] = [ib.BUILDER_VERSION, PRODUCT_BUILDER_VERSION, ib.SUITE, mirror, VARIANT, PACKAGES]
    inputs += [ib.DPKG_EXCLUDES, USER, UID, HOME]
    return hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:16]


def deps_key(rootfs: str, lock: str, arch: str, strip: bool) -> str:
    """The cache key of the image up to the dependency layer."""
    inputs: list[object] = [PRODUCT_BUILDER_VERSION, rootfs, hashlib.sha256(lock.encode()).hexdigest(), arch]
    inputs += [pip_target_options(arch), DEPS_DIR, APP_DIR, PTH_FILE, DEPS_PRUNE, strip]
    return "product-deps-" + hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:16]


def product_key(deps: str, sources: str, version: str, revision: str, source: str) -> str:
    """The cache key of the product image: the dependency image, the sources and the config inputs."""
    inputs: list[object] = [
        PRODUCT_BUILDER_VERSION,
        deps,
        sources,
        version,
        revision,
        source,
        image_ref(version),
    ]
    inputs += [ENTRYPOINT, CMD, LAUNCHER, UID, HOME, _builder_digest()]
    return "product-" + hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:16]


def _builder_digest() -> str:
    # The top layer is cheap to rebuild, so any change to either builder rebuilds it.
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(Path(ib.__file__).read_bytes())
    return digest.hexdigest()


def product_rootfs(mirror: str) -> Path:
    """The Debian rootfs tarball: python3 and the sandfleet user, made once with mmdebstrap."""
    tarball = ib.cache_root() / f"debian-{ib.SUITE}-product-{rootfs_key(mirror)}.tar"
    if tarball.exists():
        ib.progress(f"Debian rootfs cached: {tarball.name}")
        return tarball
    tarball.parent.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_suffix(".tar.part")
    ib.progress(
        f"Debian rootfs: mmdebstrap {ib.SUITE} ({VARIANT}) with {', '.join(PACKAGES)} (about a minute)"
    )
    started = time.monotonic()
    argv = [
        "mmdebstrap",
        f"--variant={VARIANT}",
        "--mode=root",
        "--format=tar",
        # Sets up merged /usr itself, so apt does not pull in usrmerge and, with it, all of perl.
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        f"--include={','.join(PACKAGES)}",
        *[f"--dpkgopt=path-exclude={pattern}" for pattern in ib.DPKG_EXCLUDES],
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        # The essential set has no useradd (passwd is not essential): write the entries directly.
        f"--customize-hook=echo '{USER}:x:{UID}:{UID}:sandfleet:{HOME}:/usr/sbin/nologin'"
        ' >> "$1"/etc/passwd',
        f"--customize-hook=echo '{USER}:x:{UID}:' >> \"$1\"/etc/group",
        f"--customize-hook=echo '{USER}:*:19000:0:99999:7:::' >> \"$1\"/etc/shadow",
        f'--customize-hook=install -d -m 0750 -o {UID} -g {UID} "$1"{HOME}',
        '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/*.log',
        ib.SUITE,
        str(partial),
        mirror,
    ]
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(ib.SOURCE_DATE_EPOCH)}
    ib.run(argv, what="mmdebstrap", env=env)
    partial.rename(tarball)
    ib.progress(f"Debian rootfs built in {time.monotonic() - started:.1f} s: {tarball.name}")
    return tarball


def build_deps(mirror: str, lock: str, arch: str) -> ib.BuiltImage:
    """Build (or reuse) the image up to the dependency layer: Debian rootfs, then the dependencies."""
    strip = strip_available()
    key = deps_key(rootfs_key(mirror), lock, arch, strip)
    hit = ib.cached(key)
    if hit is not None:
        ib.progress(f"dependency layer cached: {key}")
        return hit
    started = time.monotonic()
    tarball = product_rootfs(mirror)
    work = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=ib.cache_root()))
    try:
        layout, bundle = work / "layout", work / "bundle"
        image = f"{layout}:{DEPS_TAG}"
        ib.progress("OCI layout: umoci init and an empty image")
        ib.umoci("init", "--layout", str(layout), what="init")
        ib.umoci("new", "--image", image, what="new")
        ib.umoci("unpack", "--image", image, str(bundle), what="unpack")
        ib.progress("layer 1/3: the Debian rootfs")
        ib.run(
            ["tar", "-xpf", str(tarball), "--numeric-owner", "-C", str(bundle / "rootfs")],
            what="untar rootfs",
        )
        repack_and_refresh(image, bundle, f"Debian {ib.SUITE} rootfs with python3")
        ib.progress("layer 2/3: the runtime dependencies (pip, then byte-compiling with the image's python)")
        install_dependencies(bundle / "rootfs", lock, arch, strip)
        ib.repack(image, bundle, "sandfleet runtime dependencies")
        built = store(key, work, DEPS_TAG, started)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    ib.progress(f"dependency layer built in {built.seconds:.1f} s")
    return built


def repack_and_refresh(image: str, bundle: Path, comment: str) -> None:
    """Record the bundle's changes as one layer and make the bundle's baseline that layer.

    Without --refresh-bundle the next repack diffs against the unpacked image again and puts
    everything into one layer on top of it, replacing this one: the Debian layer and the dependency
    layer would be squashed into one, which changes whenever the lock does.
    """
    ib.umoci(
        "repack",
        "--refresh-bundle",
        "--image",
        image,
        "--history.created",
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ib.SOURCE_DATE_EPOCH)),
        "--history.comment",
        comment,
        str(bundle),
        what=f"repack ({comment})",
    )


def store(key: str, work: Path, tag: str, started: float) -> ib.BuiltImage:
    """Move an intermediate layout into the cache (no archive: only the product image is imported)."""
    layout = work / "layout"
    ib.umoci("gc", "--layout", str(layout), what="gc")
    shutil.rmtree(work / "bundle", ignore_errors=True)
    digest = ib.manifest_digest(layout, tag)
    final = ib.cache_root() / key
    shutil.rmtree(final, ignore_errors=True)
    work.rename(final)
    image = ib.BuiltImage(
        key=key,
        digest=digest,
        layout=final / "layout",
        tag=tag,
        archive=final / "layout",
        seconds=time.monotonic() - started,
        cached=False,
    )
    (final / "result.json").write_text(json.dumps(image.to_json(), indent=2) + "\n")
    return image


def install_dependencies(rootfs: Path, lock: str, arch: str, strip: bool) -> None:
    """pip-install the locked wheels into the rootfs, trim them, and byte-compile them in the image."""
    target = rootfs / DEPS_DIR.lstrip("/")
    with tempfile.TemporaryDirectory(prefix="sandfleet-lock-") as scratch:
        requirements = Path(scratch) / "requirements.txt"
        requirements.write_text(lock)
        ib.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--require-hashes",
                "--no-compile",
                "--target",
                str(target),
                *pip_target_options(arch),
                "--requirement",
                str(requirements),
            ],
            what="installing the runtime dependencies (pip --target)",
        )
    for pattern in DEPS_PRUNE:
        # Deepest first, so a directory is never removed before what lies inside it is visited.
        for path in sorted(target.glob(pattern), reverse=True):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
    for record in target.glob("*.dist-info/RECORD"):
        drop_missing_from_record(target, record)
    if strip:
        strip_debug_info(target)
    else:
        ib.progress("  binutils' strip is not installed: extension modules keep their debug info")
    pth = rootfs / PTH_FILE.lstrip("/")
    pth.parent.mkdir(parents=True, exist_ok=True)
    pth.write_text(f"{APP_DIR}\n{DEPS_DIR}\n")
    compile_in_image(rootfs, DEPS_DIR)
    normalize_times(rootfs, [DEPS_DIR, PTH_FILE])


def strip_debug_info(tree: Path) -> None:
    """Drop debug sections from extension modules that ship them (uvloop alone carries 12 MB).

    Only files with a .debug_info section are touched: the vendored libraries in *.libs/ were
    rewritten by auditwheel's patchelf, and strip must not rewrite those again.
    """
    stripped = 0
    saved = 0
    for path in sorted(tree.rglob("*.so*")):
        if not path.is_file() or path.is_symlink() or ".libs" in path.parent.name:
            continue
        sections = subprocess.run(["readelf", "-S", "-W", str(path)], capture_output=True, text=True)
        if sections.returncode != 0 or ".debug_info" not in sections.stdout:
            continue
        before = path.stat().st_size
        ib.run(["strip", "--strip-debug", str(path)], what=f"strip {path.name}")
        saved += before - path.stat().st_size
        stripped += 1
    ib.progress(f"  stripped debug info from {stripped} extension modules ({saved / 1e6:.1f} MB)")


def compile_in_image(rootfs: Path, directory: str) -> None:
    """Byte-compile with the image's own python3, so start-up never compiles (or tries to write)."""
    # unchecked-hash: the files never change in the image, and the .pyc carry no build timestamps.
    ib.run(
        [
            "chroot",
            str(rootfs),
            "/usr/bin/python3",
            "-m",
            "compileall",
            "-q",
            "--invalidation-mode",
            "unchecked-hash",
            directory,
        ],
        what=f"byte-compiling {directory}",
    )


def normalize_times(rootfs: Path, paths: Sequence[str]) -> None:
    """Give everything added (and its parent directories) one fixed time, so layers are reproducible."""
    stamp = (ib.SOURCE_DATE_EPOCH, ib.SOURCE_DATE_EPOCH)
    for name in paths:
        top = rootfs / name.lstrip("/")
        found = [top, *top.rglob("*")] if top.is_dir() else [top]
        for path in found:
            os.utime(path, stamp, follow_symlinks=False)
        parent = top.parent
        while parent != rootfs:
            os.utime(parent, stamp, follow_symlinks=False)
            parent = parent.parent


def snapshot_sources(repo: Path, dest: Path) -> None:
    """Copy what the wheel is built from: the build (and its key) see one state of a shared checkout."""
    for name in SOURCES:
        path = repo / name
        if path.is_dir():
            shutil.copytree(path, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif path.exists():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / name)


def build_wheel(source: Path, out: Path) -> Path:
    """Build the sandfleet wheel from a snapshot of the sources (the shared checkout stays untouched)."""
    wheels = out / "wheels"
    ib.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--wheel-dir",
            str(wheels),
            str(source),
        ],
        what="building the sandfleet wheel (pip wheel)",
    )
    found = sorted(wheels.glob("sandfleet-*.whl"))
    if len(found) != 1:
        raise ib.BuildError(f"pip wheel made {[p.name for p in found]}, not one sandfleet wheel")
    return found[0]


def launcher_script() -> str:
    """The `sandfleet` command: what pip's console script does, with the image's python."""
    return (
        "#!/usr/bin/python3\n"
        "import sys\n\n"
        "from sandfleet.cli import app\n\n"
        'if __name__ == "__main__":\n'
        "    sys.exit(app())\n"
    )


def install_app(rootfs: Path, wheel: Path) -> None:
    """Install the sandfleet wheel (no dependencies: they are the layer below) and the launcher."""
    target = rootfs / APP_DIR.lstrip("/")
    shutil.rmtree(target, ignore_errors=True)
    ib.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-compile",
            "--target",
            str(target),
            str(wheel),
        ],
        what="installing the sandfleet wheel (pip --target)",
    )
    # The console script has the host's python in its shebang; direct_url.json names a temp dir.
    shutil.rmtree(target / "bin", ignore_errors=True)
    for stale in target.glob("*.dist-info/direct_url.json"):
        stale.unlink()
    for record in target.glob("*.dist-info/RECORD"):
        drop_missing_from_record(target, record)
    launcher = rootfs / LAUNCHER.lstrip("/")
    launcher.parent.mkdir(parents=True, exist_ok=True)
    launcher.write_text(launcher_script())
    launcher.chmod(0o755)
    compile_in_image(rootfs, APP_DIR)
    normalize_times(rootfs, [APP_DIR, LAUNCHER])


def drop_missing_from_record(target: Path, record: Path) -> None:
    """Keep RECORD true to what is installed (and free of the temp dir direct_url.json named)."""
    lines = record.read_text().splitlines()
    kept = [line for line in lines if line and (target / line.split(",", 1)[0]).exists()]
    record.write_text("".join(f"{line}\n" for line in kept))


def tree_bytes(root: Path) -> int:
    """Bytes of the regular files under root, each hard-linked file counted once."""
    seen: set[int] = set()
    total = 0
    for path in root.rglob("*"):
        info = path.lstat()
        if path.is_symlink() or not path.is_file() or info.st_ino in seen:
            continue
        seen.add(info.st_ino)
        total += info.st_size
    return total


def configure(image: str, version: str, revision: str, source: str) -> None:
    """Set the image config: uid 10001, `sandfleet` as entrypoint, the OCI labels."""
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ib.SOURCE_DATE_EPOCH))
    labels = {
        "org.opencontainers.image.title": "sandfleet",
        "org.opencontainers.image.description": "sandfleet operator, gateway and RL actor/learner",
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.source": source,
        "org.opencontainers.image.licenses": "Apache-2.0",
    }
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": HOME,
        "LANG": "C.UTF-8",
        # Logs reach `kubectl logs` as they are written; everything is byte-compiled already.
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        # The catalogue `sandfleet rl` reads unless given --tasks (the repository's default one).
        "SANDFLEET_TASKS": f"{TASKS_DIR}/ci.yaml",
    }
    ib.umoci(
        "config",
        "--image",
        image,
        "--created",
        created,
        "--history.created",
        created,
        "--history.comment",
        "sandfleet config",
        f"--config.user={UID}:{UID}",
        f"--config.workingdir={HOME}",
        *[f"--config.env={name}={value}" for name, value in env.items()],
        *[f"--config.label={name}={value}" for name, value in labels.items()],
        *[f"--config.entrypoint={part}" for part in ENTRYPOINT],
        *[f"--config.cmd={part}" for part in CMD],
        what="config",
    )


@dataclass(frozen=True)
class Plan:
    """Every cache key of one build, computed without building anything."""

    project: Project
    lock: str
    arch: str
    deps_key: str
    key: str
    ref: str
    revision: str
    source: str
    sources: str


def plan(mirror: str, repo: Path = REPO) -> Plan:
    """Work out the keys (re-resolving the lock first only if pyproject's dependencies changed)."""
    project = read_project(repo)
    arch = machine()
    lock = current_lock(project, arch, repo / LOCK_NAME)
    deps = deps_key(rootfs_key(mirror), lock, arch, strip_available())
    rev, source = revision(repo), source_url(repo)
    sources = source_digest(repo)
    key = product_key(deps, sources, project.version, rev, source)
    return Plan(project, lock, arch, deps, key, image_ref(project.version), rev, source, sources)


def cached_product(key: str, started: float) -> ProductImage | None:
    """A previously built product image with this key, if the cache holds one."""
    path = ib.cache_root() / key / "product.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    image = ib.BuiltImage(
        key=key,
        digest=str(data["digest"]),
        layout=Path(str(data["layout"])),
        tag=str(data["tag"]),
        archive=Path(str(data["archive"])),
        seconds=time.monotonic() - started,
        cached=True,
    )
    if not image.archive.exists():
        return None
    return ProductImage(
        image=image,
        ref=str(data["ref"]),
        version=str(data["version"]),
        revision=str(data["revision"]),
        archive_bytes=int(data["archive_bytes"]),
        unpacked_bytes=int(data["unpacked_bytes"]),
        deps_key=str(data["deps_key"]),
    )


def build(mirror: str, the_plan: Plan, started: float, repo: Path = REPO) -> ProductImage:
    """Build the product image on top of the (cached) dependency image: one layer plus the config."""
    deps = build_deps(mirror, the_plan.lock, the_plan.arch)
    with tempfile.TemporaryDirectory(prefix="sandfleet-wheel-") as scratch:
        source = Path(scratch) / "source"
        snapshot_sources(repo, source)
        sources = source_digest(source)
        if sources == the_plan.sources:
            return build_product(the_plan, deps, source, started)
        # Someone edited the checkout since the plan: key the image by what it is built from.
        ib.progress("the sources changed since the cache check: keyed by the snapshot being built")
        the_plan = replace(
            the_plan,
            sources=sources,
            key=product_key(
                the_plan.deps_key, sources, the_plan.project.version, the_plan.revision, the_plan.source
            ),
        )
        hit = cached_product(the_plan.key, started)
        return hit if hit is not None else build_product(the_plan, deps, source, started)


def build_product(the_plan: Plan, deps: ib.BuiltImage, source: Path, started: float) -> ProductImage:
    """Add the sandfleet layer, built from a snapshot of the sources, and the config to the deps image."""
    key, ref = the_plan.key, the_plan.ref
    work = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=ib.cache_root()))
    try:
        layout, bundle = work / "layout", work / "bundle"
        # Blobs are content-addressed and never modified: hard links copy the layout for free. The
        # index is rewritten by umoci below, so it gets its own copy, not a link into the cache.
        ib.run(["cp", "-al", str(deps.layout), str(layout)], what="linking the dependency layout")
        (layout / "index.json").unlink()
        shutil.copy2(deps.layout / "index.json", layout / "index.json")
        ib.umoci("tag", "--image", f"{layout}:{DEPS_TAG}", ref, what="tag")
        image = f"{layout}:{ref}"
        ib.progress("layer 3/3: the sandfleet wheel built from this checkout")
        ib.umoci("unpack", "--image", image, str(bundle), what="unpack")
        wheel = build_wheel(source, source.parent)
        install_app(bundle / "rootfs", wheel)
        shutil.copytree(source / "tasks", bundle / "rootfs" / TASKS_DIR.lstrip("/"))
        normalize_times(bundle / "rootfs", [TASKS_DIR])
        unpacked = tree_bytes(bundle / "rootfs")
        ib.repack(image, bundle, f"sandfleet {the_plan.project.version}")
        ib.umoci("rm", "--image", f"{layout}:{DEPS_TAG}", what="untag the dependency image")
        configure(image, the_plan.project.version, the_plan.revision, the_plan.source)
        built = ib.finish(key, work, ref, started)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    product = ProductImage(
        image=built,
        ref=ref,
        version=the_plan.project.version,
        revision=the_plan.revision,
        archive_bytes=built.archive.stat().st_size,
        unpacked_bytes=unpacked,
        deps_key=deps.key,
    )
    # Written last: its presence is what marks the image as complete for the lock-free cache check.
    write_atomically(built.layout.parent / "product.json", json.dumps(product.to_json(), indent=2) + "\n")
    ib.progress(f"product image built in {built.seconds:.1f} s")
    return product


def prune(current: Plan | None, mirror: str, keep: int) -> list[str]:
    """Remove product images beyond the `keep` newest, other dependency images and rootfs, and debris.

    Runs under the build lock, so any half-built `.product-*` directory belongs to a dead build.
    """
    root = ib.cache_root()
    removed: list[str] = []
    products = sorted(
        (p for p in root.glob("product-*") if p.is_dir() and not p.name.startswith("product-deps-")),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    keep_names = {current.key} if current is not None else set()
    others = [p.name for p in products if p.name not in keep_names]
    keep_names.update(others[: max(keep - len(keep_names), 0)])
    for entry in products:
        if entry.name not in keep_names:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    for entry in root.glob("product-deps-*"):
        if current is not None and entry.name != current.deps_key:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    for entry in root.glob(".product-*"):
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry.name)
    keep_rootfs = f"debian-{ib.SUITE}-product-{rootfs_key(mirror)}.tar"
    for entry in root.glob(f"debian-{ib.SUITE}-product-*.tar*"):
        if entry.name != keep_rootfs:
            entry.unlink()
            removed.append(entry.name)
    return sorted(removed)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Read the command line."""
    parser = argparse.ArgumentParser(prog="hack/product-image", description=__doc__.split("\n")[0])
    parser.add_argument("--mirror", default=os.environ.get("SANDFLEET_DEBIAN_MIRROR", ib.DEFAULT_MIRROR))
    sub = parser.add_subparsers(dest="command", required=True)
    build_cmd = sub.add_parser("build", help="build (or reuse) the product image; prints its digest")
    build_cmd.add_argument("--json", action="store_true", help="print the result as one JSON line")
    sub.add_parser("lock", help="re-resolve hack/product-image.lock from pyproject.toml (needs PyPI)")
    sub.add_parser("prune", help="remove every cached product image but the current one")
    sub.add_parser("ref", help="print the image reference (localhost/sandfleet/sandfleet:<version>)")
    return parser.parse_args(argv)


def report(product: ProductImage, as_json: bool) -> None:
    """Print the result: progress lines on stderr, the digest (or the JSON line) on stdout."""
    state = "cached" if product.image.cached else "built"
    ib.progress(
        f"{state} {product.ref} {product.image.digest} in {product.image.seconds:.2f} s: "
        f"archive {product.archive_bytes / 1e6:.1f} MB, unpacked {product.unpacked_bytes / 1e6:.1f} MB"
    )
    ib.progress(f"archive {product.image.archive}")
    print(json.dumps(product.to_json()) if as_json else product.image.digest, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Build (or reuse) the image, or maintain the lock and the cache."""
    started = time.monotonic()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.command == "ref":
            print(image_ref(read_project().version))
            return 0
        if args.command == "lock":
            project = read_project()
            write_atomically(REPO / LOCK_NAME, resolve_lock(project.dependencies, machine()))
            ib.progress(f"wrote {LOCK_NAME}")
            return 0
        if os.geteuid() != 0:
            print(
                "image: building needs root (mmdebstrap --mode=root, umoci unpack, chroot)", file=sys.stderr
            )
            return 2
        the_plan = plan(args.mirror)
        if args.command == "build":
            # The warm path takes no lock: a sandbox image build elsewhere must not stall a cache hit.
            hit = cached_product(the_plan.key, started)
            if hit is not None:
                report(hit, args.json)
                return 0
        ib.cache_root().mkdir(parents=True, exist_ok=True)
        # The sandbox image's lock: one build per cache at a time; a second caller finds the result.
        lock = os.open(ib.cache_root() / ".build.lock", os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if args.command == "prune":
                for name in prune(the_plan, args.mirror, keep=1):
                    ib.progress(f"removed {name}")
                return 0
            product = cached_product(the_plan.key, started)
            if product is None:
                product = build(args.mirror, the_plan, started)
                for name in prune(the_plan, args.mirror, keep=KEEP_PRODUCTS):
                    ib.progress(f"removed {name}")
        finally:
            os.close(lock)
    except ib.BuildError as error:
        print(f"image: {error}", file=sys.stderr)
        return 1
    report(product, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
