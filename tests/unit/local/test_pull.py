"""The pull's wiring over a stand-in skopeo: retries on 429/5xx, the pin, a refused platform, the lock."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from sandfleet.cli.task_commands import task_builder_on_path
from sandfleet.local.artifacts import ImageRef
from sandfleet.local.errors import (
    ImageNotFoundError,
    ImagePlatformError,
    RegistryAuthError,
    RegistryUnavailableError,
)
from sandfleet.local.pull import RegistryAccess, image_store, resolve_image
from sandfleet.local.sources import REF_NAME, SOURCE_ANNOTATION, pinned_ref_name

# Fails with the next line of $FAKE_SKOPEO_FAILURES (consumed), else writes a one-image OCI layout
# whose config says $FAKE_SKOPEO_ARCH into the `oci:STORE:NAME` destination, as skopeo would.
FAKE_SKOPEO = textwrap.dedent(
    """\
    import hashlib, json, os, sys
    from pathlib import Path
    calls = Path(os.environ["FAKE_SKOPEO_CALLS"])
    with calls.open("a") as log:
        log.write(" ".join(sys.argv[1:]) + "\\n")
    failures = Path(os.environ["FAKE_SKOPEO_FAILURES"])
    lines = failures.read_text().splitlines() if failures.exists() else []
    if lines:
        failures.write_text("".join(line + "\\n" for line in lines[1:]))
        sys.stderr.write('time="x" level=fatal msg="' + lines[0] + '"\\n')
        sys.exit(1)
    store, name = sys.argv[-1][len("oci:"):].split(":", 1)
    store = Path(store)
    (store / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    def blob(data):
        raw = json.dumps(data).encode()
        digest = hashlib.sha256(raw).hexdigest()
        (store / "blobs" / "sha256" / digest).write_bytes(raw)
        return {"digest": "sha256:" + digest, "size": len(raw)}
    config = blob({"os": "linux", "architecture": os.environ.get("FAKE_SKOPEO_ARCH", "amd64"),
                   "config": {}, "source": sys.argv[-2]})
    manifest = blob({"schemaVersion": 2, "config": config, "layers": []})
    index_path = store / "index.json"
    REF = "org.opencontainers.image.ref.name"
    empty = {"schemaVersion": 2, "manifests": []}
    index = json.loads(index_path.read_text()) if index_path.exists() else empty
    index["manifests"] = [m for m in index["manifests"] if m["annotations"][REF] != name]
    index["manifests"].append({"mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest,
                               "annotations": {REF: name}})
    index_path.write_text(json.dumps(index))
    (store / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    """
)

REFERENCE = "127.0.0.1:5000/busybox:v1"


@pytest.fixture
def skopeo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `skopeo` first on PATH; returns the failures file (one skopeo message a line, used in turn)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "skopeo"
    script.write_text(f"#!{sys.executable}\n{FAKE_SKOPEO}")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SKOPEO_CALLS", str(tmp_path / "calls"))
    monkeypatch.setenv("FAKE_SKOPEO_FAILURES", str(tmp_path / "failures"))
    return tmp_path / "failures"


def pull(store: Path, reference: str = REFERENCE, access: RegistryAccess | None = None) -> ImageRef:
    return asyncio.run(resolve_image(reference, access, store=store, wait_s=0.001))


def test_a_pull_is_pinned_and_named_as_given(skopeo: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    image = pull(store, f"docker://{REFERENCE}")
    assert image.tag == REFERENCE
    assert image.layout == store
    assert image.ref_name == pinned_ref_name(image.digest)
    assert image.layout_ref == f"{store}:{pinned_ref_name(image.digest)}"
    (entry,) = json.loads((store / "index.json").read_text())["manifests"]
    assert entry["digest"] == image.digest
    assert entry["annotations"] == {REF_NAME: image.ref_name, SOURCE_ANNOTATION: REFERENCE}
    calls = (tmp_path / "calls").read_text()
    assert "--override-arch amd64" in calls
    assert f"docker://{REFERENCE} oci:{store}:incoming-" in calls


def test_registry_options_reach_skopeo(skopeo: Path, tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text("{}")
    pull(tmp_path / "store", access=RegistryAccess(auth_file=auth, cert_dir=tmp_path / "ca"))
    assert f"--src-authfile {auth} --src-cert-dir {tmp_path / 'ca'}" in (tmp_path / "calls").read_text()
    with pytest.raises(RegistryAuthError, match="does not exist"):
        pull(tmp_path / "store", access=RegistryAccess(auth_file=tmp_path / "absent.json"))


def test_503_and_429_are_retried_then_succeed(skopeo: Path, tmp_path: Path) -> None:
    skopeo.write_text(
        "fetching blob: received unexpected HTTP status: 503 Service Unavailable\n"
        "reading manifest v1: toomanyrequests: slow down\n"
    )
    image = pull(tmp_path / "store")
    assert image.digest.startswith("sha256:")
    assert len((tmp_path / "calls").read_text().splitlines()) == 3


def test_a_registry_that_stays_unavailable_is_a_typed_error_after_four_tries(
    skopeo: Path, tmp_path: Path
) -> None:
    skopeo.write_text("received unexpected HTTP status: 502 Bad Gateway\n" * 10)
    with pytest.raises(RegistryUnavailableError, match="after 4 tries"):
        pull(tmp_path / "store")
    assert len((tmp_path / "calls").read_text().splitlines()) == 4


def test_what_is_not_worth_retrying_is_not_retried(skopeo: Path, tmp_path: Path) -> None:
    skopeo.write_text("reading manifest v9 in 127.0.0.1:5000/busybox: manifest unknown: manifest unknown\n")
    with pytest.raises(ImageNotFoundError):
        pull(tmp_path / "store")
    assert len((tmp_path / "calls").read_text().splitlines()) == 1


def test_another_platform_is_refused_and_leaves_no_name(
    skopeo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store"
    kept = pull(store)
    monkeypatch.setenv("FAKE_SKOPEO_ARCH", "arm64")
    with pytest.raises(ImagePlatformError, match="linux/arm64"):
        pull(store, "127.0.0.1:5000/arm:v1")
    names = [m["annotations"][REF_NAME] for m in json.loads((store / "index.json").read_text())["manifests"]]
    assert names == [kept.ref_name]


def test_a_moved_tag_adds_a_pin_and_keeps_the_first(skopeo: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = pull(store, "oci-archive:/images/a.tar")
    second = pull(store, "oci-archive:/images/b.tar")  # other content (the source is in the config)
    assert first.digest != second.digest
    names = {m["annotations"][REF_NAME] for m in json.loads((store / "index.json").read_text())["manifests"]}
    assert names == {first.ref_name, second.ref_name}
    assert (store.parent / "store.lock").is_file()  # pulls into one store take turns


@pytest.mark.parametrize(
    "environment",
    [{}, {"SANDFLEET_CACHE": "/x/cache"}, {"SANDFLEET_IMAGE_STORE": "/y/store", "SANDFLEET_CACHE": "/x"}],
)
def test_the_pruner_finds_the_store_where_pulls_put_it(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str]
) -> None:
    """sandbox_image/build prune stands apart from sandfleet, so it places the store itself: the same way."""
    monkeypatch.delenv("SANDFLEET_CACHE", raising=False)
    monkeypatch.delenv("SANDFLEET_IMAGE_STORE", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    task_builder_on_path()
    import image_builder

    assert image_builder.image_store() == image_store()
