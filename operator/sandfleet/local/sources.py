"""Where an image is kept, read from its reference, and what skopeo's failures mean (pure: no I/O)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from sandfleet.local.errors import (
    ImageArchiveError,
    ImageNotFoundError,
    ImagePlatformError,
    ImageSourceError,
    RegistryAuthError,
    RegistryTrustError,
    RegistryUnavailableError,
)

SourceKind = Literal["layout", "registry", "oci-archive", "docker-archive"]

REF_NAME = "org.opencontainers.image.ref.name"
# Where each pinned entry of the store came from (the last source that gave that digest).
SOURCE_ANNOTATION = "io.sandfleet.image.source"
PIN_PREFIX = "pin-"
PLATFORM = ("linux", "amd64")

# A registry reference: a host (a dot or a port in it, or `localhost`), a path, a tag and/or a digest.
_HOST = r"(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+|[A-Za-z0-9.-]+:[0-9]+|\[[0-9A-Fa-f:]+\](?::[0-9]+)?)"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"sha256:[0-9a-f]{64}"
REGISTRY_REFERENCE = re.compile(
    rf"^(?:(?P<host>{_HOST})/)?(?P<path>{_PATH})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?$"
)

FORMS = (
    "LAYOUT[:TAG] (an OCI layout directory), docker://HOST[:PORT]/NAME[:TAG|@DIGEST] "
    "(or HOST[:PORT]/NAME[:TAG] without the prefix), oci-archive:PATH[:TAG], docker-archive:PATH[:NAME:TAG]"
)


@dataclass(frozen=True)
class ImageSource:
    """An image reference read: what kind of place holds it, and how skopeo names it.

    `location` is the layout's `PATH[:TAG]`, the registry's `HOST/NAME:TAG`, or the archive's
    `PATH[:REF]`; `name` is what leases call the image (the reference as given, less `docker://`).
    """

    kind: SourceKind
    location: str
    name: str

    @property
    def transport(self) -> str:
        """The reference in skopeo's `transport:details` form."""
        if self.kind == "registry":
            return f"docker://{self.location}"
        if self.kind == "layout":
            return f"oci:{self.location}"
        return f"{self.kind}:{self.location}"


def parse_image_source(reference: str, is_dir: Callable[[str], bool]) -> ImageSource:
    """Read an image reference; `is_dir` says whether a path is a directory (an OCI layout).

    A reference naming an existing directory (whole, or before its last `:`) is a layout, as before;
    an explicit transport prefix wins over everything; else a `HOST[:PORT]/NAME[:TAG]` is a registry's.
    """
    text = reference.strip()
    if not text:
        raise ImageNotFoundError(f"an empty image reference: give one of {FORMS}")
    archives: tuple[tuple[str, SourceKind], ...] = (
        ("oci-archive:", "oci-archive"),
        ("docker-archive:", "docker-archive"),
    )
    for prefix, kind in archives:
        if text.startswith(prefix):
            location = text[len(prefix) :]
            if not location.split(":", 1)[0]:
                raise ImageNotFoundError(f"{reference!r} names no archive file: give {prefix}PATH")
            return ImageSource(kind, location, text)
    if text.startswith("oci:"):
        return ImageSource("layout", text[len("oci:") :], text[len("oci:") :])
    if text.startswith("docker://"):
        location = _registry_location(text[len("docker://") :], reference)
        return ImageSource("registry", location, location)
    if is_dir(text) or (":" in text and is_dir(text.rpartition(":")[0])):
        return ImageSource("layout", text, text)
    match = REGISTRY_REFERENCE.match(text)
    if match and match["host"]:
        location = _registry_location(text, reference)
        return ImageSource("registry", location, location)
    raise ImageNotFoundError(
        f"{reference!r} is neither an OCI layout directory on this host nor a registry reference; "
        f"the forms are {FORMS}"
    )


def _registry_location(location: str, reference: str) -> str:
    """A registry reference with its tag: `latest` when it names neither a tag nor a digest."""
    match = REGISTRY_REFERENCE.match(location)
    if not match:
        raise ImageNotFoundError(
            f"{reference!r} is not a registry reference: give HOST[:PORT]/NAME[:TAG|@DIGEST]"
        )
    return location if match["tag"] or match["digest"] else f"{location}:latest"


def pinned_ref_name(digest: str) -> str:
    """The store's name for one manifest digest: it never moves, so unpacking it gets that digest."""
    return PIN_PREFIX + digest.replace(":", "-")


def pin_incoming(index: Mapping[str, object], incoming: str, source: str) -> tuple[dict[str, object], str]:
    """The store's index.json with the `incoming` entry (what skopeo just copied) renamed to its pin.

    Returns the new index and the pinned digest. Another entry with the same pin (an earlier pull of
    the same content) is replaced; every other entry is kept as it was.
    """
    manifests = [m for m in _manifests(index)]
    found = [m for m in manifests if _ref(m) == incoming]
    if len(found) != 1:
        raise ImageSourceError(f"the image store's index names {incoming!r} {len(found)} times after a copy")
    digest = str(found[0].get("digest", ""))
    if not digest.startswith("sha256:"):
        raise ImageSourceError(f"the image store's entry {incoming!r} has no sha256 digest")
    pin = pinned_ref_name(digest)
    annotations = {**_annotations(found[0]), REF_NAME: pin, SOURCE_ANNOTATION: source}
    kept = [m for m in manifests if _ref(m) not in (incoming, pin)]
    return {**index, "manifests": [*kept, {**found[0], "annotations": annotations}]}, digest


def drop_ref(index: Mapping[str, object], name: str) -> dict[str, object]:
    """The index without the entry named `name` (a copy refused after the fact)."""
    return {**index, "manifests": [m for m in _manifests(index) if _ref(m) != name]}


def platform_problem(config: Mapping[str, object]) -> str | None:
    """Why an image config cannot run here (not linux/amd64), or None when it can."""
    found = (str(config.get("os") or ""), str(config.get("architecture") or ""))
    if found == PLATFORM:
        return None
    return f"it is for {found[0] or '?'}/{found[1] or '?'}, and sandboxes run linux/amd64 images only"


# skopeo (containers/image) prints one `level=fatal msg="..."` line; these decide what it meant.
_AUTH = re.compile(
    r"unauthorized|authentication required|invalid username/password"
    r"|requested access to the resource is denied|denied:|\b401\b|\b403\b",
    re.IGNORECASE,
)
_UNAVAILABLE = re.compile(
    r"\b(?:429|50[0-9])\b|too ?many ?requests|service unavailable|bad gateway|gateway time-?out"
    r"|internal server error|connection refused|connection reset|\bEOF\b.*(?:registry|/v2/)|i/o timeout"
    r"|TLS handshake timeout",
    re.IGNORECASE,
)
_MISSING = re.compile(
    r"manifest unknown|name unknown|not found|no such file or directory|no descriptor found for reference"
    r"|does not exist|repository name not known",
    re.IGNORECASE,
)
_PLATFORM = re.compile(r"no image found in (?:manifest list|image index) for architecture", re.IGNORECASE)
_TRUST = re.compile(r"x509:|certificate signed by unknown authority|tls: failed to verify", re.IGNORECASE)
_ARCHIVE = re.compile(
    r"unexpected EOF|invalid tar header|archive/tar|gzip: invalid|digest did not match|does not match digest"
    r"|loading tar component|untarring|unexpected end of JSON|invalid character|not a valid",
    re.IGNORECASE,
)


def skopeo_message(stderr: str) -> str:
    """The failure itself: the last `msg="..."` of skopeo's log, else its last line."""
    messages = re.findall(r'msg="((?:[^"\\]|\\.)*)"', stderr)
    if messages:
        return str(messages[-1]).replace('\\"', '"')
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def classify_pull_failure(source: ImageSource, stderr: str) -> ImageSourceError:
    """The typed error a failed `skopeo copy` of `source` stands for, with what to do about it.

    A RegistryUnavailableError is the one worth retrying (the caller retries, then raises it).
    """
    said = skopeo_message(stderr)
    where = source.name
    if source.kind == "registry":
        if _PLATFORM.search(said):
            return ImagePlatformError(
                f"{where} has no linux/amd64 image in its index ({said}): push one for linux/amd64"
            )
        if _TRUST.search(said):
            return RegistryTrustError(
                f"{where}: the registry's TLS certificate is not trusted ({said}): give the directory "
                "holding its CA (`ca.crt`) with --registry-cert-dir"
            )
        if _AUTH.search(said):
            return RegistryAuthError(
                f"{where}: the registry refused the credentials ({said}): check the auth file given with "
                "--registry-auth-file or $REGISTRY_AUTH_FILE (containers-auth.json, as "
                "`skopeo login --authfile` writes it)"
            )
        if _MISSING.search(said):
            return ImageNotFoundError(
                f"{where}: no such image or tag in the registry ({said}): check the name and tag"
            )
        if _UNAVAILABLE.search(said):
            return RegistryUnavailableError(
                f"{where}: the registry is unavailable or rate-limiting ({said}); try again later"
            )
        return ImageSourceError(f"pulling {where} failed: {said}")
    if _MISSING.search(said) and "no such file or directory" in said.lower():
        return ImageNotFoundError(f"{where}: no such archive file ({said})")
    if source.kind == "oci-archive" and "no descriptor found for reference" in said:
        return ImageNotFoundError(f"{where}: the archive holds no such tag ({said})")
    if source.kind == "docker-archive" and re.search(r'Tag ".*" not found', said):
        return ImageNotFoundError(f"{where}: the archive holds no such image ({said})")
    if source.kind in ("oci-archive", "docker-archive"):
        corrupt = " (it looks truncated or corrupt)" if _ARCHIVE.search(said) else ""
        return ImageArchiveError(
            f"{where}: the archive cannot be read{corrupt}: {said}; make it again "
            f"(`skopeo copy ... {source.kind}:PATH`, or `docker save` for a docker-archive)"
        )
    if _MISSING.search(said):
        return ImageNotFoundError(f"{where}: no such image ({said})")
    return ImageSourceError(f"copying {where} failed: {said}")


def _manifests(index: Mapping[str, object]) -> list[dict[str, object]]:
    manifests = index.get("manifests")
    if not isinstance(manifests, list):
        raise ImageSourceError("the image store's index.json has no manifests list")
    return [m for m in manifests if isinstance(m, dict)]


def _annotations(entry: Mapping[str, object]) -> dict[str, str]:
    annotations = entry.get("annotations")
    return {str(k): str(v) for k, v in annotations.items()} if isinstance(annotations, dict) else {}


def _ref(entry: Mapping[str, object]) -> str:
    return _annotations(entry).get(REF_NAME, "")
