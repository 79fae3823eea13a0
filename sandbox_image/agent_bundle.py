"""Builds the agent bundle: the agent with its own interpreter, libraries, loader, git and setpriv.

The local runtime mounts it read-only into every sandbox of an image sandfleet did not build
(at /.sandfleet, see docs/images.md), so any image can be a sandbox: with or without Python,
glibc or musl, with or without /bin/sh. Nothing in it is the image's: the agent is started through
the bundle's own loader,

    /.sandfleet/lib64/ld-linux-x86-64.so.2 --library-path /.sandfleet/lib \
        /.sandfleet/usr/bin/python3.11 -I -S -m sandfleet_agent ...

so neither the image's libc nor its Python (nor PYTHON* or LD_LIBRARY_PATH variables) takes part,
and no variable carries the bundle's library path into the commands the agent starts: `--library-path`
is an argument of the loader, not of the environment. The agent starts git (for evaluate's
`git apply`) and setpriv (to switch to the commands' user) the same way.

It is made offline from Debian packages (`apt-get download`, then `dpkg-deb -x`), of the host's
apt sources (bookworm, as hack/bootstrap sets up), and cached under
~/.cache/sandfleet/agent-bundle/<key>/ where the key hashes the packages' versions, the agent's
source and this file: a second build is one `apt-cache policy` call.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import image_builder as ib

BUNDLE_VERSION = "1"
PYTHON = "python3.11"
MULTIARCH = "x86_64-linux-gnu"
# What the bundle is made of. Python's own packages, the libraries its interpreter and its standard
# library's extension modules link (those the agent may import), git's and setpriv's.
PACKAGES = (
    "libc6",
    "libgcc-s1",
    "zlib1g",
    "libexpat1",
    "libssl3",
    "libffi8",
    "libbz2-1.0",
    "liblzma5",
    "libuuid1",
    f"{PYTHON}-minimal",
    f"lib{PYTHON}-minimal",
    f"lib{PYTHON}-stdlib",
    "git",
    "libpcre2-8-0",
    "util-linux",
    "libcap-ng0",
    "coreutils",
)
# The programs taken from the packages (everything else of git, util-linux and coreutils is left
# out); `true` is what the agent's readiness check runs as the commands' user, in any image.
PROGRAMS = (PYTHON, "git", "setpriv", "true")
# Standard library parts the agent never uses: tests, GUIs, the bundled pip wheels.
STDLIB_SKIPPED = ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data")
LOADER = "lib64/ld-linux-x86-64.so.2"
LIBRARY_DIR = "lib"
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class BuiltBundle:
    """Where a bundle lives, what made it, and whether it came from the cache."""

    key: str
    path: Path
    packages: dict[str, str]
    seconds: float
    cached: bool

    def to_json(self) -> dict[str, object]:
        """The result as printed with --json (the runtime reads the manifest itself)."""
        return {
            "key": self.key,
            "path": str(self.path),
            "packages": self.packages,
            "seconds": round(self.seconds, 3),
            "cached": self.cached,
        }


def bundle_cache() -> Path:
    """~/.cache/sandfleet/agent-bundle, or under $SANDFLEET_CACHE."""
    return ib.cache_root().parent / "agent-bundle"


def candidate_versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """The version apt would download of each package (one `apt-cache policy` call)."""
    try:
        out = subprocess.run(
            ["apt-cache", "policy", *packages], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise ib.BuildError(f"apt-cache policy failed: {error}") from None
    return parse_policy(out, packages)


def parse_policy(text: str, packages: tuple[str, ...]) -> dict[str, str]:
    """Each package's candidate version from `apt-cache policy` output; a missing one is an error."""
    versions: dict[str, str] = {}
    current = ""
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1].split(":", 1)[0]
        elif line.strip().startswith("Candidate:") and current:
            versions[current] = line.split(":", 1)[1].strip()
    missing = [p for p in packages if versions.get(p, "(none)") == "(none)"]
    if missing:
        raise ib.BuildError(
            f"apt knows no candidate for {', '.join(missing)}: run `apt-get update` (bookworm sources)"
        )
    return {p: versions[p] for p in packages}


def bundle_key(versions: dict[str, str]) -> str:
    """Every input that changes the bundle: the package versions, the agent's source, this builder."""
    inputs = [
        BUNDLE_VERSION,
        sorted(versions.items()),
        ib.hash_tree(ib.AGENT_SOURCE),
        hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
    ]
    return "bundle-" + hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:16]


def build_bundle() -> BuiltBundle:
    """Build (or reuse) the agent bundle for the packages apt offers now."""
    started = time.monotonic()
    versions = candidate_versions()
    key = bundle_key(versions)
    final = bundle_cache() / key
    if (final / MANIFEST).is_file():
        ib.progress(f"agent bundle cached: {key}")
        return BuiltBundle(key, final, versions, time.monotonic() - started, cached=True)
    bundle_cache().mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=bundle_cache()))
    try:
        ib.progress(f"agent bundle: apt-get download of {len(versions)} Debian packages")
        debs = work / "debs"
        debs.mkdir()
        ib.run(
            ["apt-get", "download", *(f"{p}={v}" for p, v in versions.items())],
            what="apt-get download",
            cwd=debs,
        )
        staging = work / "staging"
        for deb in sorted(debs.glob("*.deb")):
            ib.run(["dpkg-deb", "-x", str(deb), str(staging)], what=f"dpkg-deb -x {deb.name}")
        bundle = work / "bundle"
        assemble(staging, bundle)
        check_libraries(bundle)
        compile_and_try(bundle)
        write_manifest(bundle, key, versions)
        ib.settle_mtimes(bundle)
        os.chmod(bundle, 0o755)
        shutil.rmtree(final, ignore_errors=True)
        bundle.rename(final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    built = BuiltBundle(key, final, versions, time.monotonic() - started, cached=False)
    ib.progress(f"agent bundle built in {built.seconds:.1f} s: {final}")
    return built


def assemble(staging: Path, bundle: Path) -> None:
    """Lay the bundle out: the loader, one flat library directory, the programs, the stdlib, the agent."""
    libs = bundle / LIBRARY_DIR
    libs.mkdir(parents=True)
    for directory in (staging / "lib" / MULTIARCH, staging / "usr" / "lib" / MULTIARCH):
        if not directory.is_dir():
            continue
        for item in sorted(directory.iterdir()):
            if (
                ".so" in item.name
                and (item.is_file() or item.is_symlink())
                and not (libs / item.name).exists()
            ):
                _copy(item, libs / item.name)
    loader = bundle / LOADER
    loader.parent.mkdir(parents=True)
    shutil.copy2(libs / "ld-linux-x86-64.so.2", loader)
    (libs / "ld-linux-x86-64.so.2").unlink()
    programs = bundle / "usr" / "bin"
    programs.mkdir(parents=True)
    for name in PROGRAMS:
        found = [p for p in (staging / "usr" / "bin" / name, staging / "bin" / name) if p.is_file()]
        if not found:
            raise ib.BuildError(f"{name} is in none of the downloaded packages")
        shutil.copy2(found[0], programs / name)
    stdlib = bundle / "usr" / "lib" / PYTHON
    shutil.copytree(
        staging / "usr" / "lib" / PYTHON,
        stdlib,
        symlinks=True,
        ignore=shutil.ignore_patterns("__pycache__", *STDLIB_SKIPPED, "_test*.so", "*_test.*.so"),
    )
    # Debian keeps sysconfig's data apart (/usr/lib/python3/dist-packages is never on the agent's
    # path: -S); the interpreter finds its prefix from the landmark lib/python3.11/os.py.
    shutil.copytree(ib.AGENT_SOURCE, stdlib / "sandfleet_agent", ignore=shutil.ignore_patterns("__pycache__"))
    for path in [bundle, *bundle.rglob("*")]:
        if not path.is_symlink():
            # Root's, readable by all, writable by none: the bundle is shared by every sandbox.
            os.chown(path, 0, 0)
            mode = path.stat().st_mode
            os.chmod(path, (0o755 if path.is_dir() or mode & 0o111 else 0o644))


def _copy(source: Path, target: Path) -> None:
    if source.is_symlink():
        os.symlink(os.readlink(source), target)
    else:
        shutil.copy2(source, target)


def needed_libraries(elf: Path) -> list[str]:
    """The DT_NEEDED entries of an ELF file (readelf -d)."""
    out = subprocess.run(["readelf", "-d", str(elf)], capture_output=True, text=True, check=False).stdout
    return [line.split("[", 1)[1].split("]", 1)[0] for line in out.splitlines() if "(NEEDED)" in line]


def check_libraries(bundle: Path) -> None:
    """Every library the programs and the extension modules link is in the bundle (or fail the build)."""
    libs = bundle / LIBRARY_DIR
    elves = [bundle / "usr" / "bin" / name for name in PROGRAMS]
    elves += sorted((bundle / "usr" / "lib" / PYTHON / "lib-dynload").glob("*.so"))
    pending, seen, missing = list(elves), set(), set()
    while pending:
        elf = pending.pop()
        for name in needed_libraries(elf):
            if name in seen or name == "ld-linux-x86-64.so.2":
                continue
            seen.add(name)
            if (libs / name).exists():
                pending.append(libs / name)
            else:
                missing.add(f"{name} (for {elf.name})")
    # Extension modules whose libraries the bundle leaves out (curses, dbm, readline, sqlite, nis,
    # audio) are dropped: the agent imports none of them, and a module that cannot load is worse
    # than an absent one.
    required = {m for m in missing if not m.endswith(".so)")}
    if required:
        raise ib.BuildError(f"the agent bundle lacks libraries: {', '.join(sorted(required))}")
    for entry in missing:
        module = entry.split("(for ", 1)[1].rstrip(")")
        (bundle / "usr" / "lib" / PYTHON / "lib-dynload" / module).unlink(missing_ok=True)


def runner(bundle: Path, program: str) -> list[str]:
    """How to run one of the bundle's programs, here or (under the mount point) in a sandbox."""
    return [
        str(bundle / LOADER),
        "--library-path",
        str(bundle / LIBRARY_DIR),
        str(bundle / "usr" / "bin" / program),
    ]


def compile_and_try(bundle: Path) -> None:
    """Byte-compile with the bundle's own interpreter (the mount is read-only) and try each program."""
    python = [*runner(bundle, PYTHON), "-I", "-S"]
    stdlib = bundle / "usr" / "lib" / PYTHON
    # Unchecked hashes: the bytecode stays valid whatever the sources' mtimes become (they are
    # settled afterwards), so no sandbox ever compiles the agent again at start.
    ib.run(
        [*python, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash", str(stdlib)],
        what="byte-compiling the bundle",
        env={},
    )
    ib.run(
        [*python, "-c", "import sandfleet_agent.__main__, hashlib, json, ssl, selectors, subprocess"],
        what="importing the agent with the bundle's interpreter",
        env={},
    )
    ib.run([*runner(bundle, "git"), "--version"], what="running the bundle's git", env={})
    ib.run([*runner(bundle, "setpriv"), "--version"], what="running the bundle's setpriv", env={})
    ib.run(runner(bundle, "true"), what="running the bundle's true", env={})


def write_manifest(bundle: Path, key: str, versions: dict[str, str]) -> None:
    """What the runtime needs to start the agent from the bundle, relative to wherever it is mounted."""
    manifest = {
        "key": key,
        "loader": LOADER,
        "library_path": [LIBRARY_DIR],
        "python": f"usr/bin/{PYTHON}",
        "git": "usr/bin/git",
        "setpriv": "usr/bin/setpriv",
        "true": "usr/bin/true",
        "packages": versions,
    }
    (bundle / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def prune() -> list[str]:
    """Remove cached bundles other than the current one and any a running local runtime mounts."""
    if not bundle_cache().is_dir():
        return []
    keep = bundle_key(candidate_versions())
    removed: list[str] = []
    for entry in sorted(bundle_cache().iterdir()):
        if entry.is_dir() and entry.name != keep and not ib._mounted(entry):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(f"agent-bundle/{entry.name}")
    return removed
