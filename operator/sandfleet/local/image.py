"""Reads an OCI image's config and unpacks its rootfs once per digest, for every sandbox to share."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from sandfleet.local.artifacts import ImageRef
from sandfleet.local.commands import CommandError, run_command
from sandfleet.local.errors import LocalRuntimeError

UNPACK_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an OCI image config a sandbox's process needs."""

    argv: list[str]
    env: list[str]
    uid: int
    gid: int
    workdir: str


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
    argv = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
    if not argv:
        raise LocalRuntimeError(f"image {image.layout}:{image.tag} has no entrypoint or command")
    user = str(config.get("User") or "0:0")
    uid_text, _, gid_text = user.partition(":")
    if not uid_text.isdigit() or not (gid_text or uid_text).isdigit():
        raise LocalRuntimeError(f"image user {user!r} must be numeric uid[:gid]")
    return ImageConfig(
        argv=[str(part) for part in argv],
        env=[str(item) for item in config.get("Env") or []],
        uid=int(uid_text),
        gid=int(gid_text or uid_text),
        workdir=str(config.get("WorkingDir") or "/"),
    )


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
        try:
            await run_command(
                ["umoci", "raw", "unpack", "--image", f"{image.layout}:{image.tag}", str(partial / "rootfs")],
                timeout_s=UNPACK_TIMEOUT_S,
            )
        except CommandError as error:
            shutil.rmtree(partial, ignore_errors=True)
            raise LocalRuntimeError(f"unpacking {image.layout}:{image.tag} failed: {error}") from None
        partial.rename(directory)
        return rootfs
    finally:
        os.close(lock)


def _lock(path: Path) -> int:
    descriptor = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    return descriptor
