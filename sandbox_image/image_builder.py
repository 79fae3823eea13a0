"""Builds the sandbox image offline (mmdebstrap, then umoci) as an OCI layout and archive, cached by inputs.

The base image is a Debian rootfs with python3, git, the sandbox user (1000) every command runs
as and the verifier user (1001) evaluate runs the tests as, plus the agent, which runs as root
inside gVisor so it can switch between them. A task image adds a task's repository (and
optionally runs its set-up command) as one more layer on top. Both are cached under
~/.cache/sandfleet/images/<key>/ where the key hashes every input, and both report the image's
manifest digest. Run through `sandbox_image/build`; needs root.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
AGENT_SOURCE = HERE / "sandfleet_agent"
BUILDER_VERSION = "1"
SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Debian packages of the base image: python3 runs the agent, git applies patches and serves tasks.
PACKAGES = ("python3", "git", "ca-certificates", "procps", "patch")
SANDBOX_UID = 1000
SANDBOX_USER = "sandbox"
VERIFIER_UID = 1001
VERIFIER_USER = "verifier"
# The agent's user in the image config: root inside gVisor (the sentry's, not the host's).
AGENT_USER = "0:0"
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
    """Where a built image lives and what it is."""

    key: str
    digest: str
    layout: Path
    tag: str
    archive: Path
    seconds: float
    cached: bool

    def to_json(self) -> dict[str, object]:
        """The result as printed with --json."""
        return {
            "key": self.key,
            "digest": self.digest,
            "layout": str(self.layout),
            "tag": self.tag,
            "archive": str(self.archive),
            "seconds": round(self.seconds, 3),
            "cached": self.cached,
        }


def cache_root() -> Path:
    """~/.cache/sandfleet/images, or under $SANDFLEET_CACHE."""
    base = os.environ.get("SANDFLEET_CACHE") or os.path.expanduser("~/.cache/sandfleet")
    return Path(base) / "images"


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
    return BuiltImage(
        key=key,
        digest=str(data["digest"]),
        layout=Path(str(data["layout"])),
        tag=str(data["tag"]),
        archive=Path(str(data["archive"])),
        seconds=0.0,
        cached=True,
    )


def base_key(mirror: str) -> str:
    """The cache key of the base image: every input that changes its content."""
    inputs = [BUILDER_VERSION, SUITE, mirror, PACKAGES, DPKG_EXCLUDES, AGENT_ENTRYPOINT, AGENT_USER]
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
        progress("layer 2/2: the agent, /workspace and /logs")
        install_agent(bundle / "rootfs")
        repack(image, bundle, "sandfleet agent")
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
    run(
        ["chroot", str(rootfs), "/usr/bin/python3", "-m", "compileall", "-q", "/opt/sandfleet/agent"],
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
        "--config.env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--config.env=PYTHONPATH=/opt/sandfleet/agent",
        "--config.env=HOME=/home/sandbox",
        "--config.env=LANG=C.UTF-8",
        "--config.exposedports=8000/tcp",
        "--config.label=org.opencontainers.image.title=sandfleet-sandbox",
        *[f"--config.entrypoint={part}" for part in AGENT_ENTRYPOINT],
        what="config",
    )


def build_task(mirror: str, name: str, workspace: Path, setup: str | None) -> BuiltImage:
    """Build (or reuse) a task image: the base plus the task's repository and set-up as one layer.

    The set-up command runs in a chroot of the image as the sandbox user, with the host's network:
    task definitions are trusted build inputs, not episode code.
    """
    if not workspace.is_dir():
        raise BuildError(f"--workspace {str(workspace)!r} is not a directory")
    base = build_base(mirror)
    inputs = [base.key, name, hash_tree(workspace), setup]
    key = "task-" + hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:16]
    hit = cached(key)
    if hit is not None:
        progress(f"task image {name!r} cached: {key}")
        return hit
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache_root()))
    tag = f"task-{name}"
    try:
        layout, bundle = work / "layout", work / "bundle"
        # Blobs are content-addressed and never modified: hard links copy the base for free.
        run(["cp", "-al", str(base.layout), str(layout)], what="linking the base layout")
        umoci("tag", "--image", f"{layout}:{TAG}", tag, what="tag")
        image = f"{layout}:{tag}"
        progress(f"task {name!r}: unpacking the base")
        umoci("unpack", "--image", image, str(bundle), what="unpack")
        rootfs = bundle / "rootfs"
        progress(f"task {name!r}: adding {workspace} as /workspace")
        run(["cp", "-a", f"{workspace}/.", str(rootfs / "workspace")], what="copying the task")
        run(["chown", "-R", f"{SANDBOX_UID}:{SANDBOX_UID}", str(rootfs / "workspace")], what="chown")
        if setup:
            progress(f"task {name!r}: running set-up: {setup}")
            run(
                [
                    "chroot",
                    f"--userspec={SANDBOX_UID}:{SANDBOX_UID}",
                    str(rootfs),
                    "/bin/sh",
                    "-c",
                    f"cd /workspace && HOME=/home/{SANDBOX_USER} {setup}",
                ],
                what="task set-up",
            )
        repack(image, bundle, f"task {name}")
        umoci("rm", "--image", f"{layout}:{TAG}", what="untag base")
        built = finish(key, work, tag, started)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    progress(f"task image {name!r} built in {built.seconds:.1f} s")
    return built


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


def _mounted(directory: Path) -> bool:
    """Whether a running local runtime shares this rootfs (a bind mount whose source is inside it)."""
    with open("/proc/self/mountinfo") as mountinfo:
        return any(line.split()[3].startswith(str(directory)) for line in mountinfo)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Read the command line."""
    parser = argparse.ArgumentParser(prog="sandbox_image/build", description=__doc__)
    parser.add_argument("--mirror", default=os.environ.get("SANDFLEET_DEBIAN_MIRROR", DEFAULT_MIRROR))
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("base", help="the base image (the default)")
    sub.add_parser("prune", help="remove cached images and rootfs other than the current base")
    task = sub.add_parser("task", help="a task image on top of the base")
    task.add_argument("--name", required=True, help="task name; the image tag becomes task-<name>")
    task.add_argument("--workspace", required=True, type=Path, help="directory copied to /workspace")
    task.add_argument("--setup", help="shell command run in /workspace as the sandbox user")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Build and print the digest (and, with --json, the whole result)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if os.geteuid() != 0:
        print("image: building needs root (mmdebstrap --mode=root, umoci unpack)", file=sys.stderr)
        return 2
    cache_root().mkdir(parents=True, exist_ok=True)
    # One build at a time per cache: a second caller waits, then finds the result cached.
    lock = os.open(cache_root() / ".build.lock", os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        if args.command == "prune":
            for name in prune(args.mirror):
                progress(f"removed {name}")
            return 0
        if args.command == "task":
            if not all(ch.isalnum() or ch in "-_." for ch in args.name):
                raise BuildError("--name may only hold letters, digits, '-', '_' and '.'")
            image = build_task(args.mirror, args.name, args.workspace, args.setup)
        else:
            image = build_base(args.mirror)
    except BuildError as error:
        print(f"image: {error}", file=sys.stderr)
        return 1
    finally:
        os.close(lock)
    progress(f"digest {image.digest} ({image.layout}:{image.tag})")
    if args.json:
        print(json.dumps(image.to_json()))
    else:
        print(image.digest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
