"""Copies images from registries and archives into one shared OCI layout store with skopeo, pinned."""

from __future__ import annotations

import json
import os
import secrets
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from sandfleet.local import locks
from sandfleet.local.artifacts import ImageRef, image_ref_from_layout
from sandfleet.local.commands import CommandError, run_command
from sandfleet.local.errors import (
    ImagePlatformError,
    ImageSourceError,
    RegistryAuthError,
    RegistryUnavailableError,
)
from sandfleet.local.sources import (
    ImageSource,
    classify_pull_failure,
    drop_ref,
    parse_image_source,
    pin_incoming,
    pinned_ref_name,
    platform_problem,
)

STORE_ENV = "SANDFLEET_IMAGE_STORE"
# A pull of a few GB over a slow link; skopeo is killed after this.
PULL_TIMEOUT_S = 1800.0
# skopeo copy again on 429/5xx: the blobs already in the store are not fetched again.
PULL_ATTEMPTS = 4
PULL_WAIT_S = 1.0


@dataclass(frozen=True)
class RegistryAccess:
    """How skopeo reaches registries: credentials (containers-auth.json) and the CA directory to trust."""

    auth_file: Path | None = None
    cert_dir: Path | None = None

    def skopeo_args(self) -> list[str]:
        """The source options of `skopeo copy` for these."""
        args: list[str] = []
        if self.auth_file is not None:
            args += ["--src-authfile", str(self.auth_file)]
        if self.cert_dir is not None:
            args += ["--src-cert-dir", str(self.cert_dir)]
        return args


def image_store() -> Path:
    """The shared store of pulled images: $SANDFLEET_IMAGE_STORE, else ~/.cache/sandfleet/image-store."""
    explicit = os.environ.get(STORE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("SANDFLEET_CACHE") or os.path.expanduser("~/.cache/sandfleet")
    return Path(base) / "image-store"


async def resolve_image(
    reference: str,
    access: RegistryAccess | None = None,
    *,
    store: Path | None = None,
    attempts: int = PULL_ATTEMPTS,
    wait_s: float = PULL_WAIT_S,
) -> ImageRef:
    """The image a reference names, pinned by digest: a layout in place, else pulled into the store."""
    source = parse_image_source(reference, os.path.isdir)
    if source.kind == "layout":
        return image_ref_from_layout(source.location)
    return await pull_image(
        source, access or RegistryAccess(), store or image_store(), attempts=attempts, wait_s=wait_s
    )


async def pull_image(
    source: ImageSource,
    access: RegistryAccess,
    store: Path,
    *,
    attempts: int = PULL_ATTEMPTS,
    wait_s: float = PULL_WAIT_S,
) -> ImageRef:
    """Copy `source` into the store (layers already there are reused) and pin what came by its digest.

    The copy lands under a name of its own, then is renamed to `pin-sha256-<hex>`: that name never
    moves, so a tag moved at the source after this cannot change what is unpacked and served.
    """
    if access.auth_file is not None and not access.auth_file.is_file():
        raise RegistryAuthError(f"the registry auth file {access.auth_file} does not exist")
    incoming = f"incoming-{os.getpid()}-{secrets.token_hex(4)}"
    async with locks.held(store.parent / f"{store.name}.lock"):
        try:
            await _copy_with_retries(source, access, store, incoming, attempts=attempts, wait_s=wait_s)
            index = _read_json(store / "index.json")
            pinned, digest = pin_incoming(index, incoming, source.name)
            image = ImageRef(layout=store, tag=source.name, digest=digest, ref_name=pinned_ref_name(digest))
            problem = platform_problem(_config_of(store, digest))
        except BaseException:
            with suppress(OSError, ValueError, ImageSourceError):
                _write_index(store, drop_ref(_read_json(store / "index.json"), incoming))
            raise
        if problem is not None:
            _write_index(store, drop_ref(index, incoming))
            raise ImagePlatformError(
                f"{source.name} ({digest}) cannot run here: {problem}; give its linux/amd64 image"
            )
        _write_index(store, pinned)
    return image


async def _copy_with_retries(
    source: ImageSource, access: RegistryAccess, store: Path, incoming: str, *, attempts: int, wait_s: float
) -> None:
    """Run skopeo copy, again on 429/5xx (skopeo itself retries a 429 a few times, as Retry-After says)."""
    tries = max(attempts, 1)
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(tries),
            wait=wait_exponential(multiplier=wait_s, max=max(wait_s * 8, 0.01)),
            retry=retry_if_exception_type(RegistryUnavailableError),
            reraise=True,
        ):
            with attempt:
                await _copy(source, access, store, incoming)
    except RegistryUnavailableError as error:
        raise RegistryUnavailableError(f"{error} (after {tries} tries)") from None


async def _copy(source: ImageSource, access: RegistryAccess, store: Path, incoming: str) -> None:
    argv = [
        *("skopeo", "copy", "--quiet", "--override-os", "linux", "--override-arch", "amd64"),
        *access.skopeo_args(),
        source.transport,
        f"oci:{store}:{incoming}",
    ]
    try:
        await run_command(argv, timeout_s=PULL_TIMEOUT_S)
    except CommandError as error:
        raise classify_pull_failure(source, error.result.stderr or error.result.stdout) from None


def _config_of(store: Path, digest: str) -> dict[str, object]:
    manifest = _read_json(_blob_path(store, digest))
    config = manifest.get("config")
    if not isinstance(config, dict):
        raise ImageSourceError(f"the manifest {digest} in {store} names no config")
    return _read_json(_blob_path(store, str(config.get("digest", ""))))


def _blob_path(store: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    if algorithm != "sha256" or len(hexdigest) != 64 or not all(c in "0123456789abcdef" for c in hexdigest):
        raise ImageSourceError(f"not a sha256 digest: {digest!r}")
    return store / "blobs" / algorithm / hexdigest


def _read_json(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ImageSourceError(f"cannot read {path}: {error}") from None
    if not isinstance(data, dict):
        raise ImageSourceError(f"{path} is not a JSON object")
    return data


def _write_index(store: Path, index: dict[str, object]) -> None:
    partial = store / f".index.json.{os.getpid()}"
    partial.write_text(json.dumps(index, separators=(",", ":")))
    partial.replace(store / "index.json")
