"""What an image may hold before the host unpacks it as root: entries, sizes, working directory (pure)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sandfleet_agent.image_config import system_directory

EntryKind = Literal["file", "dir", "symlink", "hardlink", "char", "block", "fifo", "other"]
# What one component of a path in an unpacked image is, read without following it.
NodeKind = Literal["dir", "file", "symlink", "missing"]

GIB = 1 << 30
# Everything every layer decompresses to, together: above it the image is refused as a bomb.
DEFAULT_MAX_IMAGE_BYTES = 32 * GIB
# Entries in all layers together: a layer of millions of empty files exhausts inodes, not bytes.
DEFAULT_MAX_IMAGE_ENTRIES = 2_000_000
# What must stay free on the rootfs cache's filesystem after the image is unpacked.
DEFAULT_DISK_RESERVE_BYTES = 2 * GIB
# An entry's path or link target: Linux's PATH_MAX. Real images stay far below.
MAX_NAME_BYTES = 4096
# One pax or GNU long-name header's payload: tarfile reads it into memory whole.
MAX_HEADER_BYTES = 1 << 20
# The unpacked size is estimated in filesystem blocks: a one-byte file takes one.
BLOCK_BYTES = 4096
# How many links a working directory may go through before it is called a loop (Linux's MAXSYMLINKS).
MAX_LINKS = 40

# Character devices a Debian rootfs made by mmdebstrap or debootstrap carries in /dev (sandfleet's
# own base image among them), harmless anywhere: gVisor mounts its own /dev over them, and on the
# host they sit in root's 0700 cache directory. (0, 0) is an overlayfs-style whiteout.
PSEUDO_DEVICES = {
    (1, 3): "null",
    (1, 5): "zero",
    (1, 7): "full",
    (1, 8): "random",
    (1, 9): "urandom",
    (5, 0): "tty",
    (5, 1): "console",
    (5, 2): "ptmx",
    (0, 0): "whiteout",
}
WHITEOUT_PREFIX = ".wh."
OPAQUE_WHITEOUT = ".wh..wh..opq"
LAYER_MEDIA_TYPES = {
    "application/vnd.oci.image.layer.v1.tar": "tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar": "tar",
    "application/vnd.oci.image.layer.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip": "gzip",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip": "gzip",
}
_SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class LayerLimits:
    """How big an image may be, in bytes decompressed and in entries, and the disk it must leave free."""

    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_entries: int = DEFAULT_MAX_IMAGE_ENTRIES
    disk_reserve_bytes: int = DEFAULT_DISK_RESERVE_BYTES


@dataclass(frozen=True)
class Entry:
    """What the checks need of one tar header of a layer."""

    name: str
    kind: EntryKind
    size: int = 0
    linkname: str = ""
    mode: int = 0o644
    device: tuple[int, int] = (0, 0)  # major, minor of a device node


@dataclass
class Tally:
    """What the layers scanned so far add up to."""

    entries: int = 0
    unpacked_bytes: int = 0  # regular files' sizes in whole blocks: the disk they will take
    setid_files: int = 0  # setuid or setgid regular files (their bits are cleared after unpacking)

    def add(self, entry: Entry) -> None:
        """Count one entry."""
        self.entries += 1
        if entry.kind == "file":
            self.unpacked_bytes += -(-max(entry.size, 0) // BLOCK_BYTES) * BLOCK_BYTES
            if entry.mode & 0o6000:
                self.setid_files += 1


def inside_root(path: str) -> str | None:
    """`path` relative to the image's root with `.` and `..` resolved as text, or None if it escapes.

    A leading `/` is the image's root, as umoci reads it; `a/../b` is `b`, `../b` escapes.
    """
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts)


def layer_compression(media_type: str) -> str:
    """`tar` or `gzip` for a layer's media type; ValueError (saying what to do) for any other."""
    compression = LAYER_MEDIA_TYPES.get(media_type)
    if compression is not None:
        return compression
    if media_type.endswith("+zstd"):
        raise ValueError(
            f"its layers are zstd-compressed ({media_type}), which umoci 0.4 cannot unpack: "
            "give the image with gzip layers (skopeo copy --dest-compress-format gzip)"
        )
    raise ValueError(f"a layer's media type {media_type!r} is not a tar layer this runtime can unpack")


def digest_problem(digest: str) -> str | None:
    """Why a blob digest cannot name a file in the layout (only sha256 hex is read), or None."""
    return None if _SHA256.match(digest) else f"{digest!r} is not a sha256 digest"


def entry_problem(entry: Entry) -> str | None:
    """Why the host must not unpack this entry, or None.

    Refused: a path or a hard link's target whose `..` climbs out of the root, a whiteout aimed at
    `.`, `..` or the root, a block device or a character device other than the pseudo-devices
    (null, zero, tty...), and names longer than PATH_MAX. Not refused: symbolic links, absolute
    or not (umoci resolves every path through them inside the root, and gVisor does the same at
    run time), and setuid files (their bits are cleared once unpacked).
    """
    for label, text in (("path", entry.name), ("link target", entry.linkname)):
        if len(text.encode(errors="surrogateescape")) > MAX_NAME_BYTES:
            return f"has a {label} longer than {MAX_NAME_BYTES} bytes"
    path = inside_root(entry.name)
    if path is None:
        return "climbs out of the image's root with '..'"
    if path == "" and entry.kind != "dir":
        return "would replace the image's root directory with a non-directory"
    base = path.rpartition("/")[2]
    if base.startswith(WHITEOUT_PREFIX) and base != OPAQUE_WHITEOUT:
        target = base[len(WHITEOUT_PREFIX) :]
        if target in ("", ".", ".."):
            return f"is a whiteout aimed at {target or 'its own directory'!r}, not at a file inside the image"
    if entry.kind == "hardlink":
        target_path = inside_root(entry.linkname)
        if target_path is None:
            return f"is a hard link to {entry.linkname!r}, outside the image's root"
        if target_path == "":
            return "is a hard link to the image's root directory"
    if entry.kind == "block" or (entry.kind == "char" and entry.device not in PSEUDO_DEVICES):
        device = "a character" if entry.kind == "char" else "a block"
        major, minor = entry.device
        return (
            f"is {device} device node ({major}:{minor}); only the pseudo-devices "
            f"{', '.join(sorted(set(PSEUDO_DEVICES.values()) - {'whiteout'}))} are let through (gVisor "
            "gives every sandbox its own /dev; the host must not get a node of a real device)"
        )
    return None


def size_problem(tally: Tally, stream_bytes: int, limits: LayerLimits) -> str | None:
    """Why the layers are too big (decompressed bytes or entries over the limits), or None."""
    if stream_bytes > limits.max_bytes:
        return (
            f"decompresses to more than {limits.max_bytes} bytes, the limit (a decompression bomb, or an "
            "image bigger than this host takes): raise SANDFLEET_LOCAL_MAX_IMAGE_BYTES if it is genuine"
        )
    if tally.entries > limits.max_entries:
        return (
            f"has more than {limits.max_entries} entries, the limit: raise SANDFLEET_LOCAL_MAX_IMAGE_ENTRIES "
            "if it is genuine"
        )
    return None


def space_problem(tally: Tally, free_bytes: int, limits: LayerLimits) -> str | None:
    """Why the unpacked image would not fit, leaving the reserve free on the cache's disk, or None."""
    if tally.unpacked_bytes + limits.disk_reserve_bytes <= free_bytes:
        return None
    return (
        f"unpacks to about {tally.unpacked_bytes} bytes, and {free_bytes} are free on the rootfs cache's "
        f"filesystem, of which {limits.disk_reserve_bytes} must stay free "
        "(SANDFLEET_LOCAL_DISK_RESERVE_BYTES): free some space (sandbox_image/build prune drops "
        "unused rootfs) or move SANDFLEET_CACHE"
    )


def working_dir_problem(workdir: str, node: Callable[[str], tuple[NodeKind, str]]) -> str | None:
    """Why a working directory cannot be the working area, or None; `node` reads the unpacked image.

    `node(path)` says what the root-relative `path` is without following it, and a link's target.
    Links are followed inside the image's root (as gVisor will), never out of it. A directory that
    does not exist is fine: the agent makes it, as runc makes a missing cwd. Refused: `..` in it (an
    image built by Docker never has one), a file on the way, a link loop.
    """
    if ".." in workdir.split("/"):
        return f"WorkingDir {workdir!r} has '..' in it: give an absolute path without it"
    pending = [part for part in workdir.split("/") if part not in ("", ".")]
    resolved: list[str] = []
    links = 0
    while pending:
        part = pending.pop(0)
        if part == "..":  # only from a link's target, where `..` stops at the root
            if resolved:
                resolved.pop()
            continue
        kind, target = node("/".join([*resolved, part]))
        if kind == "missing":
            return _system(workdir, "/".join([*resolved, part, *pending]))
        if kind == "file":
            where = "/".join([*resolved, part])
            return f"WorkingDir {workdir!r} goes through /{where}, which is not a directory"
        if kind == "symlink":
            links += 1
            if links > MAX_LINKS:
                return f"WorkingDir {workdir!r} goes through more than {MAX_LINKS} links (a loop)"
            if target.startswith("/"):
                resolved = []
            pending = [p for p in target.split("/") if p not in ("", ".")] + pending
            continue
        resolved.append(part)
    return _system(workdir, "/".join(resolved))


def _system(workdir: str, resolved: str) -> str | None:
    if not system_directory("/" + resolved):
        return None
    return (
        f"WorkingDir {workdir!r} is the system directory /{resolved} (or inside one): the working area "
        "is given to the commands' user, so it must be a directory of the task's, such as /testbed"
    )
