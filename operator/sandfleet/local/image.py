"""Reads an OCI image's config, checks its layers and unpacks its rootfs once per digest, for all to share."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from sandfleet.local import locks
from sandfleet.local.artifacts import ImageRef, tagged_digest
from sandfleet.local.commands import CommandError, run_command
from sandfleet.local.errors import (
    ImageConfigError,
    ImageLayerError,
    ImageSourceError,
    ImageTooLargeError,
    ImageUnpackError,
    LocalRuntimeError,
)
from sandfleet.local.injection import runs_own_agent, working_area
from sandfleet.local.layers import (
    MAX_HEADER_BYTES,
    Entry,
    EntryKind,
    LayerLimits,
    NodeKind,
    Tally,
    digest_problem,
    entry_problem,
    layer_compression,
    size_problem,
    space_problem,
    working_dir_problem,
)
from sandfleet_agent.image_files import read_image_file as read_image_file

UNPACK_TIMEOUT_S = 600.0
# How much of a layer is read at once while it is checked.
SCAN_CHUNK_BYTES = 1 << 20
# A pax record naming file capabilities: like a setuid bit, they are removed once unpacked.
CAPABILITY_PAX = "SCHILY.xattr.security.capability"
SETID_BITS = stat.S_ISUID | stat.S_ISGID


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an OCI image config a sandbox's process needs."""

    argv: list[str]
    env: list[str]
    uid: int
    gid: int
    workdir: str
    labels: dict[str, str] = field(default_factory=dict)
    user: str = ""  # the config's User as written (a name or id, `:group`); empty is root

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
    # Only an image that runs its own agent needs an entrypoint and a numeric user: any other runs
    # the injected agent as root, its User resolved by name where commands run as it (injection.py).
    if own_agent and not argv:
        raise LocalRuntimeError(f"image {image.layout}:{image.tag} has no entrypoint or command")
    user = str(config.get("User") or "")
    uid_text, _, gid_text = (user or "0:0").partition(":")
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
        user=user,
    )


def rootfs_cache() -> Path:
    """~/.cache/sandfleet/rootfs, or under $SANDFLEET_CACHE."""
    base = os.environ.get("SANDFLEET_CACHE") or os.path.expanduser("~/.cache/sandfleet")
    return Path(base) / "rootfs"


async def ensure_rootfs(image: ImageRef, limits: LayerLimits | None = None) -> Path:
    """The image's unpacked rootfs, unpacked once per digest (other processes wait on a lock).

    The runtime is root on the host and the image is untrusted: before umoci runs, every layer is
    read and checked (`sandfleet/local/layers.py`, typed errors naming the layer and the entry),
    and after it the setuid and setgid bits and file capabilities are cleared. The directory
    holding the rootfs is root's alone (0700), so no other user of the host reaches what is in it.
    The image's working directory is checked on every call (cheap): it must be usable.
    """
    directory = rootfs_cache() / image.digest.replace(":", "-")
    rootfs = directory / "rootfs"
    if not rootfs.is_dir():
        await _unpack_once(image, directory, limits or LayerLimits())
    check_working_dir(image, rootfs)
    return rootfs


async def _unpack_once(image: ImageRef, directory: Path, limits: LayerLimits) -> None:
    lock = await asyncio.to_thread(locks.lock, directory.parent / f"{directory.name}.lock")
    try:
        if (directory / "rootfs").is_dir():
            return
        # The digest was pinned at serve start: a tag moved in its layout since must not change it.
        now = tagged_digest(image.layout, image.ref_name or image.tag)
        if now != image.digest:
            raise ImageSourceError(
                f"{image.layout_ref} names {now or 'nothing'} now, not {image.digest} as when it was "
                "served: restart serve to serve what the tag names now"
            )
        # Checked before anything is written: a refused image leaves only the lock file behind.
        tally = await asyncio.to_thread(scan_layers, image, limits)
        problem = space_problem(tally, shutil.disk_usage(directory.parent).free, limits)
        if problem is not None:
            raise ImageTooLargeError(f"image {image.tag} ({image.digest}) {problem}")
        partial = directory.parent / f".{directory.name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(mode=0o700)
        try:
            await run_command(
                ["umoci", "raw", "unpack", "--image", image.layout_ref, str(partial / "rootfs")],
                timeout_s=UNPACK_TIMEOUT_S,
            )
            await asyncio.to_thread(clear_privileges, partial / "rootfs", tally.capability_files > 0)
        except CommandError as error:
            shutil.rmtree(partial, ignore_errors=True)
            raise ImageUnpackError(f"unpacking {image.layout_ref} failed: {error}") from None
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        partial.rename(directory)
    finally:
        os.close(lock)


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class _OverLimit(Exception):
    """The layers decompressed past the byte limit."""


class _Hashing(io.RawIOBase):
    """A layer blob as it is read, hashed: what was checked is what matches the digest umoci checks."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__()
        self.raw = raw
        self.sha256 = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1, /) -> bytes:
        data = self.raw.read(size if size >= 0 else SCAN_CHUNK_BYTES)
        self.sha256.update(data)
        return data

    def drain(self) -> None:
        while self.read(SCAN_CHUNK_BYTES):
            pass


class _Bounded(io.RawIOBase):
    """A layer's tar stream, counted against what the image may still decompress to.

    It also notes where the last non-zero byte ended: past the point where tarfile stopped, that
    is data tarfile did not read (a header it could not parse), which umoci might.
    """

    def __init__(self, source: _Readable, budget: int) -> None:
        super().__init__()
        self.source = source
        self.budget = budget
        self.position = 0
        self.data_end = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1, /) -> bytes:
        data = self.source.read(size if 0 <= size <= SCAN_CHUNK_BYTES else SCAN_CHUNK_BYTES)
        if self.position + len(data) > self.budget:
            raise _OverLimit
        kept = len(data.rstrip(b"\0"))
        if kept:
            self.data_end = self.position + kept
        self.position += len(data)
        return data

    def drain(self) -> None:
        while self.read(SCAN_CHUNK_BYTES):
            pass


# Headers whose payload tarfile reads into memory whole before the entry they describe.
_EXTENSION_TYPES = {tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
                    tarfile.GNUTYPE_LONGLINK}  # fmt: skip


class _HeaderTooLarge(Exception):
    """A pax or GNU long-name header's payload is over MAX_HEADER_BYTES."""


class _BoundedTarInfo(tarfile.TarInfo):
    """A TarInfo that refuses an extension header too big to read into memory (a 30 GB pax record)."""

    def _proc_member(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _EXTENSION_TYPES and self.size > MAX_HEADER_BYTES:
            raise _HeaderTooLarge
        # tarfile's own dispatch (private, stable since Python 3.2): typeshed does not list it.
        return super()._proc_member(archive)  # type: ignore[misc, no-any-return]


def _kind(member: tarfile.TarInfo) -> EntryKind:
    checks: tuple[tuple[Callable[[], bool], EntryKind], ...] = (
        (member.isreg, "file"),
        (member.isdir, "dir"),
        (member.issym, "symlink"),
        (member.islnk, "hardlink"),
        (member.ischr, "char"),
        (member.isblk, "block"),
        (member.isfifo, "fifo"),
    )
    return next((kind for check, kind in checks if check()), "other")


@dataclass
class ScanTally(Tally):
    """A Tally plus what only the reading sees: the pax records that set file capabilities."""

    capability_files: int = 0


def scan_layers(image: ImageRef, limits: LayerLimits) -> ScanTally:
    """Read every layer of the image's manifest and check each entry, before anything is unpacked.

    Raises ImageLayerError naming the layer digest and the entry, or ImageTooLargeError (with the
    limit as a number) once the layers decompress past it: a bomb is not decompressed to the end.
    """
    where = f"image {image.tag} ({image.digest})"
    try:
        layers = _blob(image.layout, image.digest).get("layers")
    except (OSError, ValueError) as error:
        raise ImageLayerError(f"{where}: cannot read its manifest: {error}") from None
    if not isinstance(layers, list):
        raise ImageLayerError(f"{where}: its manifest lists no layers")
    tally = ScanTally()
    used = 0
    for descriptor in layers:
        digest = str(descriptor.get("digest", "")) if isinstance(descriptor, dict) else ""
        media_type = str(descriptor.get("mediaType", "")) if isinstance(descriptor, dict) else ""
        problem = digest_problem(digest)
        if problem is not None:
            raise ImageLayerError(f"{where}: a layer's digest {problem}")
        try:
            compression = layer_compression(media_type)
        except ValueError as error:
            raise ImageLayerError(f"{where}: layer {digest}: {error}") from None
        used = _scan_layer(image, digest, compression, tally, used, limits)
    return tally


def _scan_layer(
    image: ImageRef, digest: str, compression: str, tally: ScanTally, used: int, limits: LayerLimits
) -> int:
    """Check one layer; return the bytes all layers up to it decompressed to."""
    where = f"image {image.tag} ({image.digest}): layer {digest}"
    path = image.layout / "blobs" / "sha256" / digest.partition(":")[2]
    try:
        with path.open("rb") as raw:
            hashing = _Hashing(raw)
            source: _Readable = (
                gzip.GzipFile(fileobj=hashing, mode="rb") if compression == "gzip" else hashing
            )
            stream = _Bounded(source, limits.max_bytes - used)
            with tarfile.open(
                fileobj=stream, mode="r|", tarinfo=_BoundedTarInfo, bufsize=SCAN_CHUNK_BYTES
            ) as archive:
                for member in archive:
                    device = (member.devmajor, member.devminor)
                    entry = Entry(
                        member.name, _kind(member), member.size, member.linkname, member.mode, device
                    )
                    problem = entry_problem(entry)
                    if problem is not None:
                        raise ImageLayerError(
                            f"{where}: entry {member.name!r} {problem}. This image cannot be unpacked "
                            "safely on this host: rebuild it without that entry"
                        )
                    tally.add(entry)
                    if CAPABILITY_PAX in member.pax_headers:
                        tally.capability_files += 1
                    problem = size_problem(tally, used + stream.position, limits)
                    if problem is not None:
                        raise ImageTooLargeError(f"image {image.tag} ({image.digest}) {problem}")
                end = archive.offset
            stream.drain()
            hashing.drain()
    except _OverLimit:
        problem = size_problem(tally, limits.max_bytes + 1, limits)
        raise ImageTooLargeError(
            f"image {image.tag} ({image.digest}) {problem} (at layer {digest})"
        ) from None
    except _HeaderTooLarge:
        raise ImageLayerError(
            f"{where}: a pax or long-name header is over {MAX_HEADER_BYTES} bytes: rebuild the image"
        ) from None
    except (OSError, EOFError, tarfile.TarError, zlib.error) as error:
        raise ImageLayerError(f"{where} is not a readable tar ({error}): pull the image again") from None
    if stream.data_end > end:
        raise ImageLayerError(
            f"{where} has data after its last entry this check can read (at byte {end}): "
            "a malformed header; rebuild the image"
        )
    if f"sha256:{hashing.sha256.hexdigest()}" != digest:
        raise ImageLayerError(f"{where} does not match its digest: pull the image again")
    return used + stream.position


def clear_privileges(rootfs: Path, capabilities: bool) -> int:
    """Clear every setuid and setgid bit (and, if asked, file capabilities) of an unpacked image.

    Inside the sandbox they would hand a command another user's rights (root's), and on the host
    an attacker's setuid-root program must not sit in root's cache. No link is followed: the walk
    goes by directory descriptors. Returns how many files it changed.
    """
    changed = 0
    for _, _, files, directory in os.fwalk(rootfs):
        for name in files:
            info = os.stat(name, dir_fd=directory, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                continue
            if info.st_mode & SETID_BITS:
                os.chmod(name, stat.S_IMODE(info.st_mode) & ~SETID_BITS, dir_fd=directory)
                changed += 1
            if capabilities:
                try:
                    os.removexattr(
                        f"/proc/self/fd/{directory}/{name}", "security.capability", follow_symlinks=False
                    )
                    changed += 1
                except OSError:
                    pass  # none set on this file
    return changed


def check_working_dir(image: ImageRef, rootfs: Path) -> None:
    """Refuse a WorkingDir the agent could not use as the working area (ImageConfigError).

    Links are resolved as gVisor will, inside the image's root; the host's files are only looked at
    (lstat, readlink), never changed. A missing directory is fine: the agent makes it.
    """
    workdir = read_image_config(image).workdir
    # working_area() turns an unset or `/` WorkingDir into the default; one with `..` is refused.
    target = workdir if ".." in workdir.split("/") else working_area(workdir)
    problem = working_dir_problem(target, lambda path: _node(rootfs, path))
    if problem is not None:
        raise ImageConfigError(f"image {image.tag} ({image.digest}): {problem}")


def _node(rootfs: Path, relative: str) -> tuple[NodeKind, str]:
    """What `relative` is in the unpacked image, not following it; every component above it is a directory."""
    path = rootfs / relative
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "missing", ""
    if stat.S_ISLNK(info.st_mode):
        return "symlink", os.readlink(path)
    return ("dir" if stat.S_ISDIR(info.st_mode) else "file"), ""
