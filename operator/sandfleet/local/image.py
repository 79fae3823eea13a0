"""Reads an OCI image's config and unpacks its rootfs once per digest, for every sandbox to share."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from sandfleet.local.artifacts import ImageRef, tagged_digest
from sandfleet.local.commands import CommandError, run_command
from sandfleet.local.errors import ImageSourceError, LocalRuntimeError
from sandfleet.local.injection import runs_own_agent

UNPACK_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an OCI image config a sandbox's process needs."""

    argv: list[str]
    env: list[str]
    uid: int
    gid: int
    workdir: str
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def own_agent(self) -> bool:
        """Whether the image carries sandfleet's agent (else the runtime injects the bundle's)."""
        return runs_own_agent(self.labels)


def _blob(layout: Path, digest: str) -> dict[str, object]:
    algorithm, _, hexdigest = digest.partition(":")
    data = json.loads((layout / "blobs" / algorithm / hexdigest).read_text())
    if not isinstance(data, dict):
        raise LocalRuntimeError(f"blob {digest} in {layout} is not a JSON object")
    return data


def read_image_config(image: ImageRef) -> ImageConfig:
    """Entrypoint, env, user and working directory from the image's config blob."""
    try:
        manifest = _blob(image.layout, image.digest)
        config_ref = manifest["config"]
        assert isinstance(config_ref, dict)
        config = _blob(image.layout, str(config_ref["digest"]))["config"]
        assert isinstance(config, dict)
    except (OSError, KeyError, ValueError, AssertionError) as error:
        raise LocalRuntimeError(f"cannot read the config of {image.layout}:{image.tag}: {error}") from None
    labels = config.get("Labels") or {}
    labels = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
    argv = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
    own_agent = runs_own_agent(labels)
    # Only an image that runs its own agent needs an entrypoint and a numeric user now; any other
    # runs the injected agent as root (its User is not used yet).
    if own_agent and not argv:
        raise LocalRuntimeError(f"image {image.layout}:{image.tag} has no entrypoint or command")
    user = str(config.get("User") or "0:0")
    uid_text, _, gid_text = user.partition(":")
    numeric = uid_text.isdigit() and (gid_text or uid_text).isdigit()
    if own_agent and not numeric:
        raise LocalRuntimeError(f"image user {user!r} must be numeric uid[:gid]")
    return ImageConfig(
        argv=[str(part) for part in argv],
        env=[str(item) for item in config.get("Env") or []],
        uid=int(uid_text) if numeric else 0,
        gid=int(gid_text or uid_text) if numeric else 0,
        workdir=str(config.get("WorkingDir") or "/"),
        labels=labels,
    )


# What the runtime reads of an image's files (its passwd and group), at most.
MAX_IMAGE_FILE_BYTES = 4 << 20


def read_image_file(rootfs: Path, relative: str) -> str | None:
    """A regular file of an unpacked image, None if absent; no link inside the image is followed.

    The image is untrusted and the runtime is root on the host: `/etc/passwd` may be a link to
    the host's files, or a FIFO. Each component is opened relative to the last, without following.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    parts = [part for part in relative.split("/") if part]
    try:
        fd = os.open(rootfs, flags | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            child = os.open(part, flags | (os.O_NONBLOCK if last else os.O_DIRECTORY), dir_fd=fd)
            os.close(fd)
            fd = child
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = b""
        while len(data) <= MAX_IMAGE_FILE_BYTES:
            chunk = os.read(fd, MAX_IMAGE_FILE_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > MAX_IMAGE_FILE_BYTES:
        return None
    return data.decode(errors="replace")


def rootfs_cache() -> Path:
    """~/.cache/sandfleet/rootfs, or under $SANDFLEET_CACHE."""
    base = os.environ.get("SANDFLEET_CACHE") or os.path.expanduser("~/.cache/sandfleet")
    return Path(base) / "rootfs"


async def ensure_rootfs(image: ImageRef) -> Path:
    """The image's unpacked rootfs, unpacked once per digest (other processes wait on a lock)."""
    directory = rootfs_cache() / image.digest.replace(":", "-")
    rootfs = directory / "rootfs"
    if rootfs.is_dir():
        return rootfs
    directory.parent.mkdir(parents=True, exist_ok=True)
    lock_path = directory.parent / f"{directory.name}.lock"
    lock = await asyncio.to_thread(_lock, lock_path)
    try:
        if rootfs.is_dir():
            return rootfs
        partial = directory.parent / f".{directory.name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        # The digest was pinned at serve start: a tag moved in its layout since must not change it.
        now = tagged_digest(image.layout, image.ref_name or image.tag)
        if now != image.digest:
            shutil.rmtree(partial, ignore_errors=True)
            raise ImageSourceError(
                f"{image.layout_ref} names {now or 'nothing'} now, not {image.digest} as when it was "
                "served: restart serve to serve what the tag names now"
            )
        try:
            await run_command(
                ["umoci", "raw", "unpack", "--image", image.layout_ref, str(partial / "rootfs")],
                timeout_s=UNPACK_TIMEOUT_S,
            )
        except CommandError as error:
            shutil.rmtree(partial, ignore_errors=True)
            raise LocalRuntimeError(f"unpacking {image.layout_ref} failed: {error}") from None
        partial.rename(directory)
        return rootfs
    finally:
        os.close(lock)


def _lock(path: Path) -> int:
    descriptor = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    return descriptor
