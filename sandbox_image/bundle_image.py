"""Builds the agent bundle image: how a Kubernetes node gets the agent bundle into any image's Pod.

One layer holding, under /.sandfleet (where the sandbox sees it):

- the agent bundle itself (agent_bundle.py: the agent, Debian's python3.11 with its own loader and
  libraries, git, setpriv, true, manifest.json);
- `bin/busybox`, Debian's busybox-static: the init container's copier (`busybox cp -R`) and the
  launcher's shell, needing nothing of the image it lands in;
- `bin/agent`, the launcher: the sandbox container runs `/.sandfleet/bin/busybox sh
  /.sandfleet/bin/agent --port 8000 ...` (sandfleet.core.pods), which keeps the environment the
  container started with for the agent (it reads the image's Env from it), moves the image's loader
  variables out of the agent's way (ld.so honours LD_PRELOAD and LD_AUDIT even when run by path)
  and starts the bundle's python through the bundle's loader.

The operator's init container copies /.sandfleet into an emptyDir that the sandbox mounts read-only
at /.sandfleet (containerd 1.6 has no image volumes). Built offline with image_builder's steps
(umoci, the same cache, lock and archive), named `localhost/sandfleet/agent-bundle:<version>` (the
chart's default), and keyed by the bundle's key, busybox's version and this file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

import agent_bundle
import image_builder as ib

BUILDER_VERSION = "2"
REPOSITORY = "localhost/sandfleet/agent-bundle"
MOUNT_POINT = "/.sandfleet"  # sandfleet.core.pods.AGENT_BUNDLE_MOUNT, sandfleet.local.injection.MOUNT_POINT
BUSYBOX_PACKAGE = "busybox-static"
BUSYBOX = "bin/busybox"
LAUNCHER = "bin/agent"
# The copier runs as nobody (core/pods.py); the image says so too.
COPIER_USER = "65534:65534"
# Cache entries (under image_builder's cache root) are named by image_key: the prefix tells them apart.
KEY_PREFIX = "agent-bundle-image-"
PYPROJECT = ib.HERE.parent / "pyproject.toml"


def image_ref() -> str:
    """`localhost/sandfleet/agent-bundle:<sandfleet's version>`: what the chart and the operator name."""
    version = tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    return f"{REPOSITORY}:{version}"


def launcher_script(manifest: dict[str, object], mount: str = MOUNT_POINT) -> str:
    """The launcher busybox's sh runs in the sandbox: from the container's start to the agent."""
    library_path = manifest["library_path"]
    assert isinstance(library_path, list)
    libraries = ":".join(f"{mount}/{part}" for part in library_path)
    return f"""# sandfleet's injected agent (sandbox_image/bundle_image.py), run as
#   {mount}/{BUSYBOX} sh {mount}/{LAUNCHER} --port 8000 [agent flags]
bb={mount}/{BUSYBOX}
# The environment the container started with (the image's Env, the pool's, the kubelet's), before
# this shell added PWD and SHLVL: the agent takes the image's Env for its commands from it.
SANDFLEET_AGENT_STARTED_ENVIRON=$("$bb" base64 -w 0 /proc/$$/environ) || exit 1
export SANDFLEET_AGENT_STARTED_ENVIRON
# ld.so honours LD_PRELOAD, LD_AUDIT and GLIBC_TUNABLES even when run by path: none of the image's
# reaches the agent's own process (its commands get them back from the copy above).
names='s/^\\(LD_[A-Za-z0-9_]*\\)=.*/\\1/p; s/^\\(GLIBC_TUNABLES\\)=.*/\\1/p'
for name in $("$bb" env | "$bb" sed -n "$names"); do
  unset "$name"
done
exec {mount}/{manifest["loader"]} --library-path {libraries} {mount}/{manifest["python"]} \\
  -I -S -m sandfleet_agent --bundle {mount} "$@"
"""


def busybox_version() -> str:
    """The busybox-static version apt would download."""
    return agent_bundle.candidate_versions((BUSYBOX_PACKAGE,))[BUSYBOX_PACKAGE]


def image_key(bundle_key: str, busybox: str, ref: str) -> str:
    """Every input that changes the image: the bundle, busybox, the name, this builder."""
    inputs = [
        BUILDER_VERSION,
        bundle_key,
        busybox,
        ref,
        hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
    ]
    return KEY_PREFIX + hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:16]


def current_key() -> str:
    """The key the agent bundle image would be built under now (apt's candidate versions, no build)."""
    return image_key(
        agent_bundle.bundle_key(agent_bundle.candidate_versions()), busybox_version(), image_ref()
    )


def stale(names: list[str], keep: str) -> list[str]:
    """The cache entries that are agent bundle images other than `keep`, build leftovers included."""
    return sorted(name for name in names if name.startswith((KEY_PREFIX, f".{KEY_PREFIX}")) and name != keep)


def prune() -> list[str]:
    """Remove cached agent bundle images other than the current one (each is a 48 MB archive).

    Runs under image_builder's build lock (sandbox_image/build prune), so no build is half-way.
    """
    root = ib.cache_root()
    if not root.is_dir():
        return []
    removed = stale([entry.name for entry in root.iterdir() if entry.is_dir()], current_key())
    for name in removed:
        shutil.rmtree(root / name, ignore_errors=True)
    return removed


def build_bundle_image() -> ib.BuiltImage:
    """Build (or reuse) the agent bundle image; the agent bundle is built (or reused) first."""
    started = time.monotonic()
    bundle = agent_bundle.build_bundle()
    busybox = busybox_version()
    ref = image_ref()
    key = image_key(bundle.key, busybox, ref)
    found = ib.cached(key)
    if found is not None:
        ib.progress(f"agent bundle image cached: {key}")
        return found
    ib.cache_root().mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=ib.cache_root()))
    try:
        layout, unpacked = work / "layout", work / "bundle"
        image = f"{layout}:{ref}"
        ib.umoci("init", "--layout", str(layout), what="init")
        ib.umoci("new", "--image", image, what="new")
        ib.umoci("unpack", "--image", image, str(unpacked), what="unpack")
        populate(unpacked / "rootfs", bundle.path, busybox, work)
        ib.repack(image, unpacked, f"sandfleet agent bundle {bundle.key}")
        configure(image)
        built = ib.finish(key, work, ref, started)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    ib.progress(f"agent bundle image built in {built.seconds:.1f} s: {ref}")
    return built


def populate(rootfs: Path, bundle: Path, busybox: str, work: Path) -> None:
    """The image's one directory: the bundle, busybox and the launcher, root's and read-only to all."""
    target = rootfs / MOUNT_POINT.lstrip("/")
    shutil.copytree(bundle, target, symlinks=True)
    zip_stdlib(target)
    debs = work / "debs"
    debs.mkdir()
    ib.run(
        ["apt-get", "download", f"{BUSYBOX_PACKAGE}={busybox}"],
        what="apt-get download busybox-static",
        cwd=debs,
    )
    (deb,) = debs.glob("*.deb")
    ib.run(["dpkg-deb", "-x", str(deb), str(work / "busybox")], what="dpkg-deb -x busybox-static")
    (target / "bin").mkdir()
    shutil.copy2(work / "busybox" / "bin" / "busybox", target / BUSYBOX)
    manifest = json.loads((target / agent_bundle.MANIFEST).read_text())
    (target / LAUNCHER).write_text(launcher_script(manifest))
    ib.run([str(target / BUSYBOX), "sh", "-n", str(target / LAUNCHER)], what="checking the launcher's syntax")
    for path in [target, *target.rglob("*")]:
        if not path.is_symlink():
            os.chown(path, 0, 0)
            mode = path.stat().st_mode
            os.chmod(path, 0o755 if path.is_dir() or mode & 0o111 else 0o644)
    ib.settle_mtimes(target)


def zip_stdlib(target: Path) -> int:
    """Move the standard library's modules into `usr/lib/python311.zip`; how many files it took.

    The copier's time goes by files, not bytes: under gVisor each one is a create through the
    gofer, and the stdlib is 1,100 of the bundle's 1,150 (docs/images.md, "Kubernetes"). Python puts
    `<prefix>/lib/python311.zip` first on sys.path by itself, and zipimport reads the legacy
    `module.pyc` beside `module.py` (the unchecked-hash pycs the bundle was compiled with; sources kept
    for tracebacks), stored, not deflated (nothing to inflate at start). Left as files: `os.py` (the
    landmark python finds its prefix by), `lib-dynload` (extension modules cannot load from a zip),
    `sandfleet_agent` (it runs its verdict runner by path) and the few data files.
    """
    stdlib = target / "usr" / "lib" / agent_bundle.PYTHON
    version = agent_bundle.PYTHON.removeprefix("python").replace(".", "")  # 311
    archive = stdlib.parent / f"python{version}.zip"
    kept = {Path("os.py"), Path("lib-dynload"), Path("sandfleet_agent")}
    moved: list[Path] = []
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zipped:
        for source in sorted(stdlib.rglob("*.py")):
            relative = source.relative_to(stdlib)
            if relative in kept or relative.parts[0] in {str(k) for k in kept}:
                continue
            compiled = source.parent / "__pycache__" / f"{source.stem}.cpython-{version}.pyc"
            for path, name in ((source, relative), (compiled, relative.with_suffix(".pyc"))):
                if not path.is_file():
                    raise ib.BuildError(f"the bundle's stdlib has no {path.relative_to(target)}")
                entry = zipfile.ZipInfo(str(name), date_time=(1980, 1, 1, 0, 0, 0))
                entry.external_attr = 0o644 << 16
                zipped.writestr(entry, path.read_bytes())
                moved.append(path)
    for path in moved:
        path.unlink()
    for directory in sorted((d for d in stdlib.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
        if not any(directory.iterdir()):
            directory.rmdir()
    # The agent and what it imports come from the zip now, with the bundle's own interpreter.
    check = (
        "import json, email.message, subprocess, sandfleet_agent.__main__; "
        f"assert json.__file__.startswith({str(archive)!r}), json.__file__"
    )
    ib.run(
        [*agent_bundle.runner(target, agent_bundle.PYTHON), "-I", "-S", "-c", check],
        what="importing the agent from the zipped stdlib",
        env={},
    )
    return len(moved)


def configure(image: str) -> None:
    """No entrypoint of its own (the Pod names the copy); nobody, at /."""
    ib.umoci(
        "config",
        "--image",
        image,
        "--created",
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ib.SOURCE_DATE_EPOCH)),
        "--history.created",
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ib.SOURCE_DATE_EPOCH)),
        "--history.comment",
        "sandfleet agent bundle config",
        f"--config.user={COPIER_USER}",
        "--config.workingdir=/",
        "--clear=config.env",
        "--clear=config.entrypoint",
        "--clear=config.cmd",
        "--config.label=org.opencontainers.image.title=sandfleet-agent-bundle",
        what="config",
    )
