"""Hostile OCI images for the local runtime's layer checks, written entry by entry with tarfile, offline.

No image builder would write these (umoci, Docker and buildah refuse or clean them), so each layer
is made here from `Member`s: paths with `..`, links and whiteouts aimed at the host, device nodes,
setuid files, decompression bombs. `write_image` makes an OCI layout of such layers with a config;
`rebase_image` puts a new config (and layers) over an existing image's layers, for an image that
must also boot. `HostSnapshot` lists what the hostile entries aim at, to compare before and after.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sandfleet.local.artifacts import ImageRef

Kind = Literal["file", "dir", "symlink", "hardlink", "char", "block", "fifo"]
_TYPES: dict[str, bytes] = {
    "file": tarfile.REGTYPE,
    "dir": tarfile.DIRTYPE,
    "symlink": tarfile.SYMTYPE,
    "hardlink": tarfile.LNKTYPE,
    "char": tarfile.CHRTYPE,
    "block": tarfile.BLKTYPE,
    "fifo": tarfile.FIFOTYPE,
}
GZIP_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
TAR_LAYER = "application/vnd.oci.image.layer.v1.tar"
ZSTD_LAYER = "application/vnd.oci.image.layer.v1.tar+zstd"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Member:
    """One tar entry as written, nothing checked; `zeros` makes a file of that many zero bytes."""

    name: str
    kind: Kind = "file"
    data: bytes = b""
    linkname: str = ""
    mode: int = 0o644
    zeros: int = 0
    device: tuple[int, int] = (0, 0)
    pax: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Layer:
    """A layer's entries and how it is stored (`raw` replaces the tar with bytes as they are)."""

    members: Sequence[Member] = ()
    media_type: str = GZIP_LAYER
    raw: bytes | None = None


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.left = size

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1, /) -> bytes:
        count = min(self.left, _CHUNK if size < 0 else size)
        self.left -= count
        return bytes(count)


def _tar(members: Iterable[Member], into: Path) -> None:
    with tarfile.open(into, "w", format=tarfile.PAX_FORMAT) as archive:
        for member in members:
            info = tarfile.TarInfo(member.name)
            info.type = _TYPES[member.kind]
            info.mode = member.mode
            info.linkname = member.linkname
            info.devmajor, info.devminor = member.device
            info.pax_headers = dict(member.pax)
            content: io.RawIOBase | io.BytesIO | None = None
            if member.kind == "file":
                info.size = member.zeros or len(member.data)
                content = _Zeros(member.zeros) if member.zeros else io.BytesIO(member.data)
            archive.addfile(info, content)


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def _put_blob(layout: Path, path: Path) -> tuple[str, int]:
    digest = _hash_file(path)
    target = layout / "blobs" / "sha256" / digest.partition(":")[2]
    shutil.move(path, target)
    return digest, target.stat().st_size


def _put_json(layout: Path, document: Mapping[str, object]) -> tuple[str, int]:
    data = json.dumps(document, sort_keys=True).encode()
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    (layout / "blobs" / "sha256" / digest.partition(":")[2]).write_bytes(data)
    return digest, len(data)


def _write_layer(layout: Path, layer: Layer) -> tuple[dict[str, object], str]:
    """The layer's descriptor and its diff id (the uncompressed tar's digest)."""
    work = layout / ".work"
    work.mkdir(exist_ok=True)
    plain, stored = work / "layer.tar", work / "layer.blob"
    if layer.raw is not None:
        stored.write_bytes(layer.raw)
        plain.write_bytes(gzip.decompress(layer.raw) if layer.media_type == GZIP_LAYER else layer.raw)
    else:
        _tar(layer.members, plain)
        if layer.media_type == TAR_LAYER:
            shutil.copyfile(plain, stored)
        else:  # gzip, or zstd in name only: the checks refuse it by its media type before reading
            with plain.open("rb") as source, gzip.open(stored, "wb", compresslevel=6) as target:
                shutil.copyfileobj(source, target, _CHUNK)
    diff_id = _hash_file(plain)
    digest, size = _put_blob(layout, stored)
    shutil.rmtree(work)
    return {"mediaType": layer.media_type, "digest": digest, "size": size}, diff_id


def write_image(
    directory: Path,
    tag: str,
    layers: Sequence[Layer],
    config: dict[str, object] | None = None,
    base: Sequence[tuple[dict[str, object], str]] = (),
) -> ImageRef:
    """An OCI layout at `directory` with one image, `tag`, of these layers over `base`'s descriptors."""
    layout = directory
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    written = [*base, *(_write_layer(layout, layer) for layer in layers)]
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config or {"Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id for _, diff_id in written]},
    }
    config_digest, config_size = _put_json(layout, image_config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config_size,
        },
        "layers": [descriptor for descriptor, _ in written],
    }
    manifest_digest, manifest_size = _put_json(layout, manifest)
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": manifest_size,
                "annotations": {"org.opencontainers.image.ref.name": tag},
            }
        ],
    }
    (layout / "index.json").write_text(json.dumps(index))
    return ImageRef(layout=layout, tag=tag, digest=manifest_digest)


def rebase_image(
    source: ImageRef, directory: Path, tag: str, config: dict[str, object], layers: Sequence[Layer] = ()
) -> ImageRef:
    """`source`'s layers (blobs copied) under `layers`, with `config` as the image's config."""
    blobs = source.layout / "blobs" / "sha256"
    manifest = json.loads((blobs / source.digest.partition(":")[2]).read_text())
    old_config = json.loads((blobs / manifest["config"]["digest"].partition(":")[2]).read_text())
    (directory / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    for descriptor in manifest["layers"]:
        name = descriptor["digest"].partition(":")[2]
        shutil.copyfile(blobs / name, directory / "blobs" / "sha256" / name)
    base = list(zip(manifest["layers"], old_config["rootfs"]["diff_ids"], strict=True))
    return write_image(directory, tag, layers, config, base=base)


@dataclass(frozen=True)
class HostSnapshot:
    """What is under some host directories: each path's type, mode, size and content digest."""

    entries: dict[str, tuple[str, int, int, str]]

    @classmethod
    def take(cls, roots: Iterable[Path]) -> HostSnapshot:
        entries: dict[str, tuple[str, int, int, str]] = {}
        for root in roots:
            for directory, dirs, files, directory_fd in os.fwalk(root):
                for name in [*dirs, *files]:
                    info = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
                    path = f"{directory}/{name}"
                    kind, content = "other", ""
                    if stat.S_ISDIR(info.st_mode):
                        kind = "dir"
                    elif stat.S_ISLNK(info.st_mode):
                        kind, content = "link", os.readlink(name, dir_fd=directory_fd)
                    elif stat.S_ISREG(info.st_mode):
                        kind = "file"
                        if info.st_size <= _CHUNK:
                            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=directory_fd)
                            with os.fdopen(fd, "rb") as opened:
                                content = hashlib.sha256(opened.read()).hexdigest()
                    entries[path] = (kind, info.st_mode, info.st_size if kind != "dir" else 0, content)
        return cls(entries)

    def changes(self, after: HostSnapshot) -> dict[str, list[str]]:
        """Paths added, removed and changed between this snapshot and `after`."""
        return {
            "added": sorted(after.entries.keys() - self.entries.keys()),
            "removed": sorted(self.entries.keys() - after.entries.keys()),
            "changed": sorted(
                p for p in self.entries.keys() & after.entries.keys() if self.entries[p] != after.entries[p]
            ),
        }


def names_containing(token: str, roots: Iterable[Path]) -> list[str]:
    """Every path under `roots` whose name has `token` in it (top two levels: what an escape could make)."""
    found: list[str] = []
    for root in roots:
        for entry in [root, *(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())]:
            try:
                found += [str(child) for child in entry.iterdir() if token in child.name]
            except OSError:
                continue
    return found
