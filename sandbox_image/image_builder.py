"""Builds the sandbox image offline (mmdebstrap, then umoci) as an OCI layout and archive, cached by inputs.

The base image is a Debian rootfs with python3, git, the sandbox user (1000) every command runs
as and the verifier user (1001) evaluate runs the tests as, plus the agent, which runs as root
inside gVisor so it can switch between them. A task image adds a task's repository (and
optionally runs its set-up command) as one more layer on top. Both are cached under
~/.cache/sandfleet/images/<key>/ where the key hashes every input, and both report the image's
manifest digest. Run through `sandbox_image/build`; needs root.
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
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
AGENT_SOURCE = HERE / "sandfleet_agent"
BUILDER_VERSION = "1"
SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Debian packages of the base image: python3 runs the agent, git applies patches and serves tasks,
# python3-venv carries ensurepip's wheels, from which the image's task venv gets `python3 -m pip`.
PACKAGES = ("python3", "python3-venv", "git", "ca-certificates", "procps", "patch")
SANDBOX_UID = 1000
SANDBOX_USER = "sandbox"
VERIFIER_UID = 1001
VERIFIER_USER = "verifier"
# The agent's user in the image config: root inside gVisor (the sentry's, not the host's).
AGENT_USER = "0:0"
# Tasks install into this venv, first on every command's PATH, and never into Debian's python: PEP 668
# marks that one externally managed, and the agent (root) runs on it, so a task's packages must not
# shadow what it imports. The venv is root's after the build: the episode cannot plant a pytest
# plugin or a .pth file that the verifier's test run would then load.
TASK_VENV = "/opt/venv"
IMAGE_PATH = f"{TASK_VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TAG = "sandfleet"
SOURCE_DATE_EPOCH = 1_700_000_000
# Trimmed from the rootfs: documentation and translations are dead weight in a sandbox.
DPKG_EXCLUDES = (
    "/usr/share/doc/*",
    "/usr/share/man/*",
    "/usr/share/info/*",
    "/usr/share/locale/*",
    "/usr/share/lintian/*",
)
AGENT_ENTRYPOINT = (
    "/usr/bin/python3",
    "-m",
    "sandfleet_agent",
    "--port",
    "8000",
    "--root",
    "/workspace",
    "--exec-user",
    f"{SANDBOX_UID}:{SANDBOX_UID}",
    "--verifier-user",
    f"{VERIFIER_UID}:{VERIFIER_UID}",
)


class BuildError(Exception):
    """A build step failed; the message says which and why."""


@dataclass(frozen=True)
class BuiltImage:
    """Where a built image lives and what it is (for a task image also where from and its set-up log)."""

    key: str
    digest: str
    layout: Path
    tag: str
    archive: Path
    seconds: float
    cached: bool
    log: Path | None = None
    source: dict[str, str] | None = None

    def to_json(self) -> dict[str, object]:
        """The result as printed with --json."""
        result: dict[str, object] = {
            "key": self.key,
            "digest": self.digest,
            "layout": str(self.layout),
            "tag": self.tag,
            "archive": str(self.archive),
            "seconds": round(self.seconds, 3),
            "cached": self.cached,
        }
        if self.log is not None:
            result["log"] = str(self.log)
        if self.source is not None:
            result["source"] = dict(self.source)
        return result


def cache_root() -> Path:
    """~/.cache/sandfleet/images, or under $SANDFLEET_CACHE."""
    base = os.environ.get("SANDFLEET_CACHE") or os.path.expanduser("~/.cache/sandfleet")
    return Path(base) / "images"


_lock_depth = 0


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """One build at a time per cache: a second caller waits, then finds the result cached.

    Re-entrant within a process, so the command line and the Python API can both take it.
    """
    global _lock_depth
    if _lock_depth:
        _lock_depth += 1
        try:
            yield
        finally:
            _lock_depth -= 1
        return
    cache_root().mkdir(parents=True, exist_ok=True)
    lock = os.open(cache_root() / ".build.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _lock_depth = 1
        yield
    finally:
        _lock_depth = 0
        os.close(lock)


def progress(message: str) -> None:
    """Report a step on stderr (stdout is kept for the result)."""
    print(f"image: {message}", file=sys.stderr, flush=True)


def run(argv: list[str], *, what: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    """Run a build tool, streaming its output as progress; fail with its last lines."""
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    except FileNotFoundError:
        raise BuildError(f"{what}: {argv[0]} is not installed (hack/bootstrap installs it)") from None
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        tail = [*tail[-19:], line]
        if line.startswith(("I:", "W:", "E:")):
            progress(f"  {line}")
    if proc.wait() != 0:
        raise BuildError(f"{what} failed ({argv[0]} exited {proc.returncode}):\n" + "\n".join(tail))


def hash_tree(root: Path) -> str:
    """A digest of a directory's paths, modes and contents (ignoring bytecode caches)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts:
            continue
        relative = path.relative_to(root).as_posix()
        info = path.lstat()
        digest.update(f"{relative}\0{info.st_mode:o}\0".encode())
        if path.is_symlink():
            digest.update(os.readlink(path).encode())
        elif path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def debian_rootfs(mirror: str) -> Path:
    """The Debian rootfs tarball for the base image, made once with mmdebstrap."""
    key = hashlib.sha256(
        json.dumps([BUILDER_VERSION, SUITE, mirror, PACKAGES, DPKG_EXCLUDES, SANDBOX_UID]).encode()
    ).hexdigest()[:16]
    tarball = cache_root() / f"debian-{SUITE}-{key}.tar"
    if tarball.exists():
        progress(f"Debian rootfs cached: {tarball.name}")
        return tarball
    tarball.parent.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_suffix(".tar.part")
    progress(f"Debian rootfs: mmdebstrap {SUITE} with {', '.join(PACKAGES)} (about a minute)")
    started = time.monotonic()
    argv = [
        "mmdebstrap",
        "--variant=apt",
        "--mode=root",
        "--format=tar",
        f"--include={','.join(PACKAGES)}",
        *[f"--dpkgopt=path-exclude={pattern}" for pattern in DPKG_EXCLUDES],
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        f'--customize-hook=chroot "$1" useradd --create-home --uid {SANDBOX_UID} '
        f"--user-group --shell /bin/bash {SANDBOX_USER}",
        '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin',
        SUITE,
        str(partial),
        mirror,
    ]
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)}
    run(argv, what="mmdebstrap", env=env)
    partial.rename(tarball)
    progress(f"Debian rootfs built in {time.monotonic() - started:.1f} s: {tarball.name}")
    return tarball


def umoci(*args: str, what: str) -> None:
    """Run one umoci command."""
    run(["umoci", *args], what=f"umoci {what}")


def manifest_digest(layout: Path, tag: str) -> str:
    """The manifest digest the layout's index records for a tag."""
    index = json.loads((layout / "index.json").read_text())
    for manifest in index.get("manifests", []):
        if manifest.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            return str(manifest["digest"])
    raise BuildError(f"tag {tag!r} is missing from {layout}/index.json")


def archive_layout(layout: Path, archive: Path) -> None:
    """Pack an OCI layout into an oci-archive tarball (what skopeo and `ctr import` read)."""
    partial = archive.with_suffix(".part")
    run(
        [
            "tar",
            "--sort=name",
            f"--mtime=@{SOURCE_DATE_EPOCH}",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "-cf",
            str(partial),
            "-C",
            str(layout),
            ".",
        ],
        what="archiving the layout",
    )
    partial.rename(archive)


def finish(key: str, work: Path, tag: str, started: float) -> BuiltImage:
    """Move a finished build into the cache and describe it."""
    layout = work / "layout"
    umoci("gc", "--layout", str(layout), what="gc")
    shutil.rmtree(work / "bundle", ignore_errors=True)
    archive = work / "image.oci.tar"
    archive_layout(layout, archive)
    digest = manifest_digest(layout, tag)
    final = cache_root() / key
    shutil.rmtree(final, ignore_errors=True)
    work.rename(final)
    image = BuiltImage(
        key=key,
        digest=digest,
        layout=final / "layout",
        tag=tag,
        archive=final / "image.oci.tar",
        seconds=time.monotonic() - started,
        cached=False,
    )
    (final / "result.json").write_text(json.dumps(image.to_json(), indent=2) + "\n")
    return image


def cached(key: str) -> BuiltImage | None:
    """A previously built image with this key, if the cache holds one."""
    result = cache_root() / key / "result.json"
    if not result.exists():
        return None
    data = json.loads(result.read_text())
    source = data.get("source")
    return BuiltImage(
        key=key,
        digest=str(data["digest"]),
        layout=Path(str(data["layout"])),
        tag=str(data["tag"]),
        archive=Path(str(data["archive"])),
        seconds=0.0,
        cached=True,
        log=Path(str(data["log"])) if data.get("log") else None,
        source={str(k): str(v) for k, v in source.items()} if isinstance(source, dict) else None,
    )


def base_key(mirror: str) -> str:
    """The cache key of the base image: every input that changes its content."""
    inputs = [
        BUILDER_VERSION,
        SUITE,
        mirror,
        PACKAGES,
        DPKG_EXCLUDES,
        AGENT_ENTRYPOINT,
        AGENT_USER,
        IMAGE_PATH,
    ]
    inputs.append(hash_tree(AGENT_SOURCE))
    inputs.append(hashlib.sha256(Path(__file__).read_bytes()).hexdigest())
    return "base-" + hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:16]


def build_base(mirror: str) -> BuiltImage:
    """Build (or reuse) the base image: Debian layer, then the agent layer."""
    key = base_key(mirror)
    hit = cached(key)
    if hit is not None:
        progress(f"base image cached: {key}")
        return hit
    started = time.monotonic()
    tarball = debian_rootfs(mirror)
    cache_root().mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache_root()))
    try:
        layout, bundle = work / "layout", work / "bundle"
        image = f"{layout}:{TAG}"
        progress("OCI layout: umoci init and an empty image")
        umoci("init", "--layout", str(layout), what="init")
        umoci("new", "--image", image, what="new")
        umoci("unpack", "--image", image, str(bundle), what="unpack")
        progress("layer 1/2: the Debian rootfs")
        run(
            ["tar", "-xpf", str(tarball), "--numeric-owner", "-C", str(bundle / "rootfs")],
            what="untar rootfs",
        )
        repack(image, bundle, "Debian bookworm rootfs")
        progress(f"layer 2/2: the agent, /workspace, /logs and the task venv {TASK_VENV}")
        install_agent(bundle / "rootfs")
        make_task_venv(bundle / "rootfs")
        repack(image, bundle, "sandfleet agent and task venv")
        configure(image)
        built = finish(key, work, TAG, started)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    progress(f"base image built in {built.seconds:.1f} s")
    return built


def repack(image: str, bundle: Path, comment: str) -> None:
    """Record the bundle's changes since the last unpack or repack as one layer."""
    umoci(
        "repack",
        "--image",
        image,
        "--history.created",
        _created(),
        "--history.comment",
        comment,
        str(bundle),
        what=f"repack ({comment})",
    )


def _created() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(SOURCE_DATE_EPOCH))


def install_agent(rootfs: Path) -> None:
    """Copy the agent in, byte-compile it with the image's own python, and make the work dirs."""
    target = rootfs / "opt" / "sandfleet" / "agent" / "sandfleet_agent"
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(AGENT_SOURCE, target, ignore=shutil.ignore_patterns("__pycache__"))
    # In this layer, not the cached Debian one, so adding it did not mean a new mmdebstrap run.
    if f"\n{VERIFIER_USER}:" not in "\n" + (rootfs / "etc" / "passwd").read_text():
        run(
            [
                *("chroot", str(rootfs), "useradd", "--create-home", "--uid", str(VERIFIER_UID)),
                *("--user-group", "--shell", "/bin/bash", VERIFIER_USER),
            ],
            what="adding the verifier user",
        )
    # The rootfs is shared read-only at run time: compile now so start-up never tries to write.
    # Unchecked hashes, not mtimes: the sources are stamped with SOURCE_DATE_EPOCH below, which
    # would leave mtime-checked bytecode stale and every boot compiling the agent again.
    run(
        [
            *("chroot", str(rootfs), "/usr/bin/python3", "-m", "compileall", "-q"),
            *("--invalidation-mode", "unchecked-hash", "/opt/sandfleet/agent"),
        ],
        what="byte-compiling the agent",
    )
    # The sandbox user owns its working area; /logs is root's and /logs/verifier the verifier's,
    # so the episode's code can write neither (the agent empties and re-owns it per evaluate).
    for name, uid in (("workspace", SANDBOX_UID), ("logs", 0), ("logs/verifier", VERIFIER_UID)):
        directory = rootfs / name
        directory.mkdir(parents=True, exist_ok=True)
        os.chown(directory, uid, uid)
        os.chmod(directory, 0o755)
    for path in [target.parent, *target.parent.rglob("*")]:
        os.utime(path, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False)


def make_task_venv(rootfs: Path) -> None:
    """Create the root-owned task venv with pip (from Debian's ensurepip wheels, so offline)."""
    run(
        ["chroot", str(rootfs), "/usr/bin/env", "-i", "/usr/bin/python3", "-m", "venv", TASK_VENV],
        what=f"creating the task venv {TASK_VENV}",
    )
    settle_mtimes(rootfs / TASK_VENV.lstrip("/"))


def settle_mtimes(root: Path) -> None:
    """Stamp a tree with SOURCE_DATE_EPOCH so the layer does not depend on when it was built."""
    for path in [root, *root.rglob("*")]:
        os.utime(path, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False)


def configure(image: str) -> None:
    """Set the image config: the agent (root inside gVisor) as entrypoint, the work dir."""
    umoci(
        "config",
        "--image",
        image,
        "--created",
        _created(),
        "--history.created",
        _created(),
        "--history.comment",
        "sandfleet agent config",
        f"--config.user={AGENT_USER}",
        "--config.workingdir=/workspace",
        f"--config.env=PATH={IMAGE_PATH}",
        "--config.env=PYTHONPATH=/opt/sandfleet/agent",
        "--config.env=HOME=/home/sandbox",
        "--config.env=LANG=C.UTF-8",
        "--config.exposedports=8000/tcp",
        "--config.label=org.opencontainers.image.title=sandfleet-sandbox",
        *[f"--config.entrypoint={part}" for part in AGENT_ENTRYPOINT],
        what="config",
    )


def prune(mirror: str) -> list[str]:
    """Remove cached images (and their unpacked rootfs) other than the current base image.

    Task images are removed too; they are rebuilt on demand from their cache keys.
    """
    keep = base_key(mirror)
    current = cached(keep)
    removed: list[str] = []
    for entry in sorted(cache_root().iterdir()):
        if (
            entry.is_dir()
            and entry.name.startswith(("base-", "task-", ".base-", ".task-"))
            and entry.name != keep
        ):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    rootfs_cache = cache_root().parent / "rootfs"
    keep_rootfs = current.digest.replace(":", "-") if current is not None else None
    if rootfs_cache.is_dir():
        for entry in sorted(rootfs_cache.iterdir()):
            if entry.is_dir() and entry.name != keep_rootfs and not _mounted(entry):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(f"rootfs/{entry.name}")
    return removed


def image_store() -> Path:
    """The pulled images' store, as `sandfleet/local/pull.py` places it (a test holds the two equal)."""
    return Path(os.environ.get("SANDFLEET_IMAGE_STORE") or cache_root().parent / "image-store")


def prune_image_store() -> list[str]:
    """Remove the local runtime's store of pulled images (`sandfleet/local/pull.py`), whole.

    Everything in it came from a registry or an archive and is pulled again on the next serve; the
    rootfs unpacked from it are pruned above (those a running serve shares are kept). Its lock is
    the pull's own, so no serve is pulling into it meanwhile.
    """
    store = image_store()
    if not store.exists():
        return []
    store.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(store.parent / f"{store.name}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        shutil.rmtree(store, ignore_errors=True)
    finally:
        os.close(descriptor)
    return [store.name]


def _mounted(directory: Path) -> bool:
    """Whether a running local runtime shares this rootfs (a bind mount whose source is inside it)."""
    with open("/proc/self/mountinfo") as mountinfo:
        return any(line.split()[3].startswith(str(directory)) for line in mountinfo)
