"""Images for the real node without a registry: the catatonit pause image, and importing OCI archives."""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import IO, Any

from localcluster.paths import CACHE_ROOT

CATATONIT = Path("/usr/bin/catatonit")
PAUSE_REPOSITORY = "sandfleet.dev/pause"
# Bumped when the pause image's layout changes, so a cached archive from an older builder is rebuilt.
PAUSE_BUILDER_VERSION = "1"
SOURCE_DATE_EPOCH = 1_700_000_000
CREATED = "2023-11-14T22:13:20Z"  # SOURCE_DATE_EPOCH in RFC 3339: the same bytes on every build
# containerd reads the image name from this annotation when importing an OCI archive.
CONTAINERD_NAME = "io.containerd.image.name"
OCI_REF_NAME = "org.opencontainers.image.ref.name"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"


def _log(message: str) -> None:
    print(f"[hack/cluster image] {message}", file=sys.stderr, flush=True)


_DOMAIN = r"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*(?::[0-9]+)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_FULL_REF = re.compile(rf"{_DOMAIN}(?:/{_COMPONENT})+(?::[\w][\w.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?")


def normalize_ref(ref: str) -> str:
    """The fully qualified name the CRI looks images up by (`busybox:1` -> `docker.io/library/busybox:1`)."""
    name, at, digest = ref.partition("@")
    first, slash, _ = name.partition("/")
    if not slash or ("." not in first and ":" not in first and first != "localhost"):
        # No registry host in front: Docker's defaults, which is how kubelet and containerd read it.
        name = f"docker.io/{name}" if slash else f"docker.io/library/{name}"
    if ":" not in name.rsplit("/", 1)[1] and not at:
        name += ":latest"
    full = f"{name}@{digest}" if at else name
    if not _FULL_REF.fullmatch(full):
        raise ValueError(f"not an image reference: {ref!r}")
    return full


def debian_version(package: str) -> str:
    """The installed Debian package's version (the pause image's cache key follows it)."""
    result = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True, check=False
    )
    if result.returncode != 0 or not result.stdout:
        raise SystemExit(f"Debian package {package} is not installed: run hack/bootstrap")
    return result.stdout


def pause_ref(version: str) -> str:
    """The pause image's reference for one catatonit version (a tag may not hold '+' or '~')."""
    return f"{PAUSE_REPOSITORY}:catatonit-{re.sub(r'[^A-Za-z0-9_.-]', '-', version)}"


def _blob(payload: bytes) -> tuple[str, int]:
    return "sha256:" + hashlib.sha256(payload).hexdigest(), len(payload)


def _json(document: dict[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def oci_archive(
    files: dict[str, tuple[bytes, int]],
    *,
    entrypoint: list[str],
    user: str,
    ref: str,
) -> bytes:
    """A one-layer OCI image archive holding `files` (path -> (content, mode)), named `ref`.

    Deterministic: the same inputs give the same bytes, so the image digest is a cache key too.
    """
    layer_buffer = io.BytesIO()
    with tarfile.open(fileobj=layer_buffer, mode="w", format=tarfile.PAX_FORMAT) as layer:
        for path, (content, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(content), mode, SOURCE_DATE_EPOCH
            layer.addfile(info, io.BytesIO(content))
    layer_bytes = layer_buffer.getvalue()
    layer_digest, layer_size = _blob(layer_bytes)
    config = _json(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": CREATED,
            "config": {"Entrypoint": entrypoint, "User": user, "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
            "history": [{"created": CREATED, "comment": "sandfleet offline image"}],
        }
    )
    config_digest, config_size = _blob(config)
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": config_size},
            "layers": [{"mediaType": MEDIA_LAYER, "digest": layer_digest, "size": layer_size}],
        }
    )
    manifest_digest, manifest_size = _blob(manifest)
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                {
                    "mediaType": MEDIA_MANIFEST,
                    "digest": manifest_digest,
                    "size": manifest_size,
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {CONTAINERD_NAME: ref, OCI_REF_NAME: ref},
                }
            ],
        }
    )
    entries = {
        "oci-layout": _json({"imageLayoutVersion": "1.0.0"}),
        "index.json": index,
        **{
            f"blobs/sha256/{digest.removeprefix('sha256:')}": payload
            for digest, payload in (
                (layer_digest, layer_bytes),
                (config_digest, config),
                (manifest_digest, manifest),
            )
        },
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for directory in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, SOURCE_DATE_EPOCH
            archive.addfile(info)
        for name, payload in sorted(entries.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(payload), 0o644, SOURCE_DATE_EPOCH
            archive.addfile(info, io.BytesIO(payload))
    return out.getvalue()


def pause_image() -> tuple[Path, str]:
    """Build (or reuse) the pause image: Debian's static catatonit in its pause mode (`-P`).

    Returns the archive and its reference; cached under ~/.cache/sandfleet/images/ by the
    catatonit version and the builder version.
    """
    version = debian_version("catatonit")
    ref = pause_ref(version)
    directory = CACHE_ROOT / "images" / f"pause-{ref.rsplit(':', 1)[1]}-b{PAUSE_BUILDER_VERSION}"
    archive = directory / "image.oci.tar"
    if archive.exists():
        return archive, ref
    _log(f"pause image: catatonit {version} -> {ref}")
    payload = oci_archive(
        {"/catatonit": (CATATONIT.read_bytes(), 0o755)},
        entrypoint=["/catatonit", "-P"],
        user="65535:65535",  # upstream's pause runs as nobody too; it needs no privilege
        ref=ref,
    )
    directory.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(".part")
    partial.write_bytes(payload)
    partial.rename(archive)
    return archive, ref


def archive_refs(archive: Path) -> list[str]:
    """The names an OCI archive's index gives its images (containerd's, else the OCI ref name)."""
    with tarfile.open(archive) as source:
        index = _read_index(source)
    names = []
    for manifest in index.get("manifests", []):
        annotations = manifest.get("annotations", {})
        name = annotations.get(CONTAINERD_NAME) or annotations.get(OCI_REF_NAME)
        if name:
            names.append(str(name))
    return names


def _read_index(source: tarfile.TarFile) -> dict[str, Any]:
    for member in source:
        if member.name.lstrip("./") == "index.json":
            handle = source.extractfile(member)
            assert handle is not None
            document: dict[str, Any] = json.load(handle)
            return document
    raise ValueError(f"{source.name!r} is not an OCI archive (no index.json)")


def renamed_index(index: dict[str, Any], ref: str) -> dict[str, Any]:
    """The index with its single image named `ref` for containerd (the OCI ref name is left alone)."""
    manifests = index.get("manifests", [])
    if len(manifests) != 1:
        raise ValueError(f"--ref needs an archive with exactly one image; this one has {len(manifests)}")
    renamed: dict[str, Any] = json.loads(json.dumps(index))
    renamed["manifests"][0].setdefault("annotations", {})[CONTAINERD_NAME] = ref
    return renamed


def import_archive(ctr: list[str], archive: Path, ref: str | None = None) -> str:
    """Import an OCI archive into containerd's k8s.io namespace (where the CRI looks); return its name.

    The archive is streamed to `ctr images import -` with its index renamed to the normalized
    reference, so kubelet finds it under the name a Pod spec uses (`sandfleet/sandbox:0.1.0`
    means docker.io/sandfleet/sandbox:0.1.0 to the CRI).
    """
    if ref is None:
        names = archive_refs(archive)
        full = [n for n in names if "/" in n or ":" in n]
        if len(full) != 1:
            raise ValueError(f"{archive} names its image {names or 'nothing'}: pass --ref NAME:TAG")
        ref = full[0]
    name = normalize_ref(ref)
    with subprocess.Popen(
        [*ctr, "-n", "k8s.io", "images", "import", "--no-unpack=false", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    ) as proc:
        assert proc.stdin is not None
        assert proc.stdout is not None
        try:
            _stream_renamed(archive, name, proc.stdin)
        finally:
            proc.stdin.close()
        output = proc.stdout.read().decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"ctr images import {archive} failed:\n{output[-3000:]}")
    return name


def _stream_renamed(archive: Path, ref: str, sink: IO[bytes]) -> None:
    with tarfile.open(archive) as source:
        index = renamed_index(_read_index(source), ref)
    payload = _json(index)
    with tarfile.open(archive) as source, tarfile.open(fileobj=sink, mode="w|") as target:
        for member in source:
            if member.name.lstrip("./") == "index.json":
                info = tarfile.TarInfo("index.json")
                info.size, info.mode, info.mtime = len(payload), 0o644, member.mtime
                target.addfile(info, io.BytesIO(payload))
            elif member.isfile():
                target.addfile(member, source.extractfile(member))
            else:
                target.addfile(member)
