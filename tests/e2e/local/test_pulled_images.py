"""Images from where users keep them: a real registry (TLS, basic auth), an oci-archive, a docker-archive.

The registry is Debian's docker-registry on loopback (tests/support/registry.py); the images are
the foreign test images (tests/support/foreign_images.py) pushed into it with skopeo. A real
`serve --local` pulls them into its own store, pinned by digest, and leases them under runsc. The
errors are made by real skopeo against that registry, an HTTPS front that answers 503/429 in its
place, and archives cut short.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandfleet.local.artifacts import IMAGE_BUILD_SCRIPT, ImageRef, image_ref_from_json
from sandfleet.local.errors import (
    ImageArchiveError,
    ImageNotFoundError,
    ImagePlatformError,
    ImageSourceError,
    RegistryAuthError,
    RegistryTrustError,
    RegistryUnavailableError,
)
from sandfleet.local.pull import STORE_ENV, RegistryAccess, resolve_image
from sandfleet.local.sources import REF_NAME, SOURCE_ANNOTATION
from tests.support.foreign_images import (
    BULLSEYE_GLIBC,
    BULLSEYE_MARKER,
    BULLSEYE_WORKDIR,
    BUSYBOX_MARKER,
    BUSYBOX_WORKDIR,
    IMAGES,
    build_foreign_image,
)
from tests.support.registry import (
    PASSWORD,
    USER,
    Fault,
    FaultyFront,
    LocalRegistry,
    start_registry,
    variant_layout,
    write_auth_file,
)
from tests.support.servers import start_local_serve, stop_local_serve

pytestmark = pytest.mark.gvisor

AUTH = {"Authorization": "Bearer local-token"}


@dataclass(frozen=True)
class Images:
    """What the registry and the archives hold."""

    registry: LocalRegistry
    foreign: dict[str, ImageRef]
    pushed: dict[str, str]  # name:tag in the registry -> manifest digest
    oci_archive: Path  # distroless
    docker_archive: Path  # musl
    bullseye_archive: Path  # bullseye, a docker-archive
    directory: Path

    def access(self) -> RegistryAccess:
        return RegistryAccess(auth_file=self.registry.auth_file, cert_dir=self.registry.cert_dir)

    def ref(self, name: str) -> str:
        return f"{self.registry.host}/{name}"


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Images]:
    """The registry with busybox, musl and bullseye pushed, and the archives, made once for the module."""
    directory = tmp_path_factory.mktemp("pulled")
    foreign = {name: build_foreign_image(name) for name in IMAGES}
    registry = start_registry(directory / "registry")
    try:
        pushed = {
            f"{name}:v1": registry.push(f"oci:{foreign[name].layout_ref}", f"{name}:v1")
            for name in ("busybox", "musl", "bullseye")
        }
        oci_archive = directory / "distroless.oci.tar"
        docker_archive = directory / "musl.docker.tar"
        bullseye_archive = directory / "bullseye.docker.tar"
        subprocess.run(["skopeo", "copy", "--quiet", f"oci:{foreign['distroless'].layout_ref}",
                        f"oci-archive:{oci_archive}:distroless"], check=True)  # fmt: skip
        subprocess.run(["skopeo", "copy", "--quiet", f"oci:{foreign['musl'].layout_ref}",
                        f"docker-archive:{docker_archive}:musl:v1"], check=True)  # fmt: skip
        subprocess.run(["skopeo", "copy", "--quiet", f"oci:{foreign['bullseye'].layout_ref}",
                        f"docker-archive:{bullseye_archive}:bullseye:v1"], check=True)  # fmt: skip
        yield Images(registry, foreign, pushed, oci_archive, docker_archive, bullseye_archive, directory)
    finally:
        registry.stop()


@dataclass(frozen=True)
class Served:
    url: str
    store: Path
    moving: str  # the reference whose tag the test moves after serve started
    moving_digest: str


@pytest.fixture(scope="module")
def served(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One `serve --local` of a registry image (auth + TLS), a tag to move, and both archives."""
    moving = images.ref("moving:v1")
    moving_digest = images.registry.push(f"oci:{images.foreign['busybox'].layout_ref}", "moving:v1")
    store = tmp_path_factory.mktemp("store") / "image-store"
    references = [
        f"docker://{images.ref('busybox:v1')}",
        images.ref("bullseye:v1"),
        moving,
        f"oci-archive:{images.oci_archive}",
        f"docker-archive:{images.docker_archive}",
        f"docker-archive:{images.bullseye_archive}",
    ]
    url, process, log = start_local_serve(
        tmp_path_factory.mktemp("serve"),
        warm=1,
        extra_args=[
            *(arg for reference in references for arg in ("--image", reference)),
            *("--registry-auth-file", str(images.registry.auth_file)),
            *("--registry-cert-dir", str(images.registry.cert_dir)),
        ],
        settings={STORE_ENV: str(store)},
        timeout=300,
    )
    try:
        yield Served(url, store, moving, moving_digest)
    finally:
        stop_local_serve(process, log)


def lease(served: Served, image: str) -> dict[str, Any]:
    response = httpx.post(
        f"{served.url}/v1/leases", json={"image": image, "wait_seconds": 120}, headers=AUTH, timeout=150
    )
    assert response.status_code == 201, response.text
    (view,) = response.json()["leases"]
    return dict(view)


def release(served: Served, lease_id: str) -> None:
    httpx.delete(f"{served.url}/v1/leases/{lease_id}", headers=AUTH, timeout=60)


def run(served: Served, lease_id: str, **body: Any) -> dict[str, Any]:
    response = httpx.post(f"{served.url}/v1/leases/{lease_id}/exec", json=body, headers=AUTH, timeout=120)
    assert response.status_code == 200, response.text
    return dict(response.json())


def store_digest(store: Path, source: str) -> str:
    """The digest the store pinned for a source (what serve recorded when it pulled it)."""
    index = json.loads((store / "index.json").read_text())
    found = {m["digest"] for m in index["manifests"] if m["annotations"].get(SOURCE_ANNOTATION) == source}
    assert len(found) == 1, index
    return str(found.pop())


@pytest.mark.parametrize(
    ("name", "marker", "workdir"),
    [("busybox", BUSYBOX_MARKER, BUSYBOX_WORKDIR), ("bullseye", BULLSEYE_MARKER, BULLSEYE_WORKDIR)],
)
def test_a_registry_image_with_auth_and_tls_is_leased_and_runs(
    images: Images, served: Served, name: str, marker: str, workdir: str
) -> None:
    view = lease(served, images.ref(f"{name}:v1"))  # leases name it without docker://
    try:
        assert view["image_digest"] == images.pushed[f"{name}:v1"]
        result = run(served, view["id"], shell="echo $MARKER; pwd")
        assert result["stdout"].splitlines() == [marker, workdir], result
    finally:
        release(served, view["id"])


def test_an_oci_archive_and_a_docker_archive_are_leased(images: Images, served: Served) -> None:
    oci = lease(served, f"oci-archive:{images.oci_archive}")
    docker = lease(served, f"docker-archive:{images.docker_archive}")
    bullseye = lease(served, f"docker-archive:{images.bullseye_archive}")
    try:
        # skopeo keeps an OCI manifest as it is: the same digest as the layout it was made from.
        assert oci["image_digest"] == images.foreign["distroless"].digest
        assert docker["image_digest"] == store_digest(served.store, f"docker-archive:{images.docker_archive}")
        ran = run(served, oci["id"], argv=["busybox", "sh", "-c", "echo $PATH; pwd"])
        assert ran["stdout"] == "/app\n/app\n", ran
        musl = run(served, docker["id"], shell="/lib/ld-musl-x86_64.so.1 2>&1 | head -1")
        assert musl["stdout"] == "musl libc (x86_64)\n", musl
        old = run(
            served, bullseye["id"], shell="ldd --version | head -1; pwd; command -v python3 || echo none"
        )
        assert old["stdout"].splitlines()[1:] == [BULLSEYE_WORKDIR, "none"], old
        assert old["stdout"].splitlines()[0].endswith(f" {BULLSEYE_GLIBC}"), old
    finally:
        release(served, oci["id"])
        release(served, docker["id"])
        release(served, bullseye["id"])


def test_a_tag_moved_after_serve_started_does_not_change_what_a_lease_gets(
    images: Images, served: Served
) -> None:
    # Other content under the same tag, and pulled again into the same store (as another serve would).
    moved = images.registry.push(f"oci:{images.foreign['musl'].layout_ref}", "moving:v1")
    assert moved != served.moving_digest
    again = asyncio.run(resolve_image(served.moving, images.access(), store=served.store))
    assert again.digest == moved
    # The warm sandbox, then one booted now, after the move: both are what serve pinned at start.
    first = lease(served, served.moving)
    second = lease(served, served.moving)
    try:
        for view in (first, second):
            assert view["image_digest"] == served.moving_digest
            assert run(served, view["id"], shell="echo $MARKER")["stdout"] == f"{BUSYBOX_MARKER}\n"
    finally:
        release(served, first["id"])
        release(served, second["id"])


def test_layers_are_stored_once_across_images(images: Images, tmp_path: Path) -> None:
    """Two images with the same layer (busybox, and busybox with a label) keep one copy of it."""
    labelled = variant_layout(images.foreign["busybox"].layout, "busybox", tmp_path, "amd64", {"x": "y"})
    images.registry.push(f"oci:{labelled}:single-amd64", "labelled:v1")
    store = tmp_path / "store"
    blobs = store / "blobs" / "sha256"
    first = asyncio.run(resolve_image(images.ref("busybox:v1"), images.access(), store=store))
    before = {p.name for p in blobs.iterdir()}
    second = asyncio.run(resolve_image(images.ref("labelled:v1"), images.access(), store=store))
    after = {p.name for p in blobs.iterdir()}
    assert first.digest != second.digest
    layers = [
        [
            layer["digest"]
            for layer in json.loads((blobs / image.digest.split(":", 1)[1]).read_text())["layers"]
        ]
        for image in (first, second)
    ]
    assert layers[0] == layers[1]
    assert len(after - before) == 2  # the second image's manifest and config only
    index = json.loads((store / "index.json").read_text())
    assert [m["annotations"][REF_NAME] for m in index["manifests"]] == [first.ref_name, second.ref_name]


def _truncated(source: Path, directory: Path) -> Path:
    cut = directory / f"truncated-{source.name}"
    cut.write_bytes(source.read_bytes()[: source.stat().st_size // 2])
    return cut


def test_each_bad_source_is_a_typed_error(images: Images, tmp_path: Path) -> None:
    """Real skopeo against the real registry, a front answering 503/429, and damaged archives."""
    registry = images.registry
    store = tmp_path / "store"
    wrong = write_auth_file(tmp_path / "wrong.json", registry.host, USER, PASSWORD + "-not")
    arm = variant_layout(images.foreign["busybox"].layout, "busybox", tmp_path)
    registry.push(f"oci:{arm}:single-arm64", "arm:single")
    registry.push(f"oci:{arm}:index-arm64", "arm:index", every_platform=True)
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not an archive\n" * 100)
    access = images.access()
    no_auth, no_ca = RegistryAccess(None, registry.cert_dir), RegistryAccess(registry.auth_file, None)
    cut_oci, cut_docker = (
        _truncated(images.oci_archive, tmp_path),
        _truncated(images.docker_archive, tmp_path),
    )
    cases: list[tuple[str, RegistryAccess, type[ImageSourceError], str]] = [
        (images.ref("busybox:v9"), access, ImageNotFoundError, "no such image or tag"),
        (images.ref("nothing-here:v1"), access, ImageNotFoundError, "no such image or tag"),
        (images.ref("busybox:v1"), RegistryAccess(wrong, registry.cert_dir), RegistryAuthError, "credential"),
        (images.ref("busybox:v1"), no_auth, RegistryAuthError, "credentials"),
        (images.ref("busybox:v1"), no_ca, RegistryTrustError, "cert-dir"),
        (images.ref("arm:single"), access, ImagePlatformError, "linux/arm64"),
        (images.ref("arm:index"), access, ImagePlatformError, "no linux/amd64"),
        (f"oci-archive:{cut_oci}", access, ImageArchiveError, "truncated"),
        (f"docker-archive:{cut_docker}", access, ImageArchiveError, "truncated"),
        (f"oci-archive:{junk}", access, ImageArchiveError, "cannot be read"),
        (f"docker-archive:{junk}", access, ImageArchiveError, "cannot be read"),
        (f"oci-archive:{tmp_path / 'absent.tar'}", access, ImageNotFoundError, "no such archive"),
        (f"oci-archive:{images.oci_archive}:no-such-tag", access, ImageNotFoundError, "no such tag"),
    ]  # fmt: skip
    for reference, how, kind, words in cases:
        with pytest.raises(kind) as raised:
            asyncio.run(resolve_image(reference, how, store=store, wait_s=0.05))
        assert type(raised.value) is kind, (reference, raised.value)
        assert words in str(raised.value), (reference, str(raised.value))
    # Nothing refused stays named in the store.
    assert json.loads((store / "index.json").read_text())["manifests"] == []


@pytest.mark.parametrize(("status", "path"), [(503, r"/blobs/"), (429, r"/blobs/"), (503, r"/manifests/")])
def test_a_registry_failing_mid_pull_is_retried_then_a_typed_error(
    images: Images, tmp_path: Path, status: int, path: str
) -> None:
    registry = images.registry
    with FaultyFront(registry, [Fault(path, status)]) as front:
        access = RegistryAccess(front.auth_file, registry.cert_dir)
        with pytest.raises(RegistryUnavailableError, match=r"after 4 tries") as raised:
            asyncio.run(resolve_image(f"{front.host}/busybox:v1", access, store=tmp_path / "s", wait_s=0.05))
        failed = [r for r in front.requests if r[2] == status]
    assert str(status) in str(raised.value) or "too many requests" in str(raised.value)
    # Four copies; skopeo itself tries a 429 a few times within each (it honours Retry-After).
    assert len(failed) >= 4


def test_a_registry_failing_a_few_times_mid_pull_is_retried_to_success(
    images: Images, tmp_path: Path
) -> None:
    registry = images.registry
    faults = [Fault(r"/blobs/", 503, times=2), Fault(r"/manifests/", 429, times=1)]
    with FaultyFront(registry, faults) as front:
        access = RegistryAccess(front.auth_file, registry.cert_dir)
        image = asyncio.run(
            resolve_image(f"{front.host}/busybox:v1", access, store=tmp_path / "s", wait_s=0.05)
        )
    assert image.digest == images.pushed["busybox:v1"]
    assert [fault.injected for fault in faults] == [2, 1]


def _serve_once(arguments: list[str], store: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandfleet.cli", "serve", "--local", "--warm", "1", *arguments],
        capture_output=True, text=True, timeout=180, env={**os.environ, STORE_ENV: str(store)},
    )  # fmt: skip


def test_serve_says_what_was_wrong_without_a_traceback(images: Images, tmp_path: Path) -> None:
    registry = images.registry
    wrong = write_auth_file(tmp_path / "wrong.json", registry.host, USER, "nope")
    refused = _serve_once(
        ["--image", images.ref("busybox:v1"), "--registry-auth-file", str(wrong),
         "--registry-cert-dir", str(registry.cert_dir)], tmp_path / "store",
    )  # fmt: skip
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert "error:" in refused.stderr
    assert "refused the credentials" in refused.stderr
    assert "Traceback" not in refused.stderr + refused.stdout
    cut = _truncated(images.docker_archive, tmp_path)
    broken = _serve_once(["--image", f"docker-archive:{cut}"], tmp_path / "store")
    assert broken.returncode == 1
    assert "truncated or corrupt" in broken.stderr
    assert "Traceback" not in broken.stderr + broken.stdout


def test_pull_through_sandfleet_against_plain_skopeo(images: Images, tmp_path: Path) -> None:
    """Median of 3 cold pulls of the same images, into an empty store / an empty directory, same run."""
    registry = images.registry
    built = subprocess.run([str(IMAGE_BUILD_SCRIPT), "--json"], capture_output=True, text=True, check=True)
    base = image_ref_from_json(built.stdout.strip().splitlines()[-1])
    registry.push(f"oci:{base.layout_ref}", "sandfleet-base:bench")
    rows = []
    for name in ("busybox:v1", "sandfleet-base:bench"):
        reference = images.ref(name)
        through, plain = [], []
        for round_ in range(3):
            store = tmp_path / f"store-{round_}"
            start = time.perf_counter()
            asyncio.run(resolve_image(reference, images.access(), store=store))
            through.append(time.perf_counter() - start)
            target = tmp_path / f"plain-{round_}"
            start = time.perf_counter()
            subprocess.run(["skopeo", "copy", "--quiet", "--src-authfile", str(registry.auth_file),
                            "--src-cert-dir", str(registry.cert_dir), f"docker://{reference}",
                            f"oci:{target}:x"], check=True)  # fmt: skip
            plain.append(time.perf_counter() - start)
            size = sum(p.stat().st_size for p in (target / "blobs" / "sha256").iterdir())
            shutil.rmtree(store)
            shutil.rmtree(target)
        rows.append((name, size, statistics.median(through), statistics.median(plain)))
    print("\npull from the local registry (TLS, basic auth), cold, median of 3:")
    print("| image | size | sandfleet (resolve_image) | skopeo copy | ratio |")
    print("|---|---|---|---|---|")
    for name, size, through_s, plain_s in rows:
        ratio = through_s / plain_s
        print(f"| {name} | {size / 1e6:.1f} MB | {through_s:.3f} s | {plain_s:.3f} s | {ratio:.2f} |")
    for _, _, through_s, plain_s in rows:
        assert through_s < plain_s * 2 + 0.5  # sandfleet adds a lock, an index rewrite and two reads
