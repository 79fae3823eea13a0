"""Image references read, the store's pinning, and skopeo's failures as typed errors: plain data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import pytest

from sandfleet.local.errors import (
    ImageArchiveError,
    ImageNotFoundError,
    ImagePlatformError,
    ImageSourceError,
    RegistryAuthError,
    RegistryTrustError,
    RegistryUnavailableError,
)
from sandfleet.local.sources import (
    REF_NAME,
    SOURCE_ANNOTATION,
    ImageSource,
    classify_pull_failure,
    drop_ref,
    parse_image_source,
    pin_incoming,
    pinned_ref_name,
    platform_problem,
    skopeo_message,
)

LAYOUTS = {"/srv/layout", "/odd:dir"}
D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64


def parse(reference: str) -> ImageSource:
    return parse_image_source(reference, lambda path: path in LAYOUTS)


@pytest.mark.parametrize(
    ("reference", "kind", "location", "name"),
    [
        ("/srv/layout", "layout", "/srv/layout", "/srv/layout"),
        ("/srv/layout:task-a", "layout", "/srv/layout:task-a", "/srv/layout:task-a"),
        ("/odd:dir", "layout", "/odd:dir", "/odd:dir"),
        ("oci:/elsewhere:t", "layout", "/elsewhere:t", "/elsewhere:t"),
        (
            "docker://127.0.0.1:5000/busybox:v1",
            "registry",
            "127.0.0.1:5000/busybox:v1",
            "127.0.0.1:5000/busybox:v1",
        ),
        (
            "127.0.0.1:5000/team/busybox:v1",
            "registry",
            "127.0.0.1:5000/team/busybox:v1",
            "127.0.0.1:5000/team/busybox:v1",
        ),
        ("localhost/busybox", "registry", "localhost/busybox:latest", "localhost/busybox:latest"),
        (
            "registry.example.com/a/b@" + D1,
            "registry",
            "registry.example.com/a/b@" + D1,
            "registry.example.com/a/b@" + D1,
        ),
        ("docker://busybox", "registry", "busybox:latest", "busybox:latest"),
        ("oci-archive:/tmp/x.tar", "oci-archive", "/tmp/x.tar", "oci-archive:/tmp/x.tar"),
        ("oci-archive:/tmp/x.tar:v2", "oci-archive", "/tmp/x.tar:v2", "oci-archive:/tmp/x.tar:v2"),
        (
            "docker-archive:/tmp/saved.tar",
            "docker-archive",
            "/tmp/saved.tar",
            "docker-archive:/tmp/saved.tar",
        ),
    ],
)
def test_references_name_where_the_image_is_kept(reference: str, kind: str, location: str, name: str) -> None:
    source = parse(reference)
    assert (source.kind, source.location, source.name) == (kind, location, name)


def test_transports_are_skopeos() -> None:
    assert parse("127.0.0.1:5000/b:v1").transport == "docker://127.0.0.1:5000/b:v1"
    assert parse("oci-archive:/tmp/x.tar:v2").transport == "oci-archive:/tmp/x.tar:v2"
    assert parse("docker-archive:/tmp/s.tar").transport == "docker-archive:/tmp/s.tar"
    assert parse("/srv/layout:t").transport == "oci:/srv/layout:t"


@pytest.mark.parametrize(
    "reference", ["", "busybox", "/not/a/dir:tag", "oci-archive:", "docker://UPPER/Case:tag", "host.io/a:b:c"]
)
def test_what_is_neither_a_layout_nor_a_reference_is_refused_with_the_forms(reference: str) -> None:
    with pytest.raises(ImageNotFoundError):
        parse(reference)


def test_a_bare_name_is_not_taken_for_docker_hub() -> None:
    # Without a host it would mean docker.io, which nothing here reaches: say the forms instead.
    with pytest.raises(ImageNotFoundError, match="docker://HOST"):
        parse("busybox:latest")


def _entry(digest: str, name: str, **extra: str) -> dict[str, object]:
    return {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": digest,
        "size": 349,
        "annotations": {REF_NAME: name, **extra},
    }


def test_the_copy_is_renamed_to_its_digests_pin_and_nothing_else_moves() -> None:
    index = {"schemaVersion": 2, "manifests": [_entry(D2, pinned_ref_name(D2)), _entry(D1, "incoming-1-ab")]}
    pinned, digest = pin_incoming(index, "incoming-1-ab", "127.0.0.1:5000/b:v1")
    assert digest == D1
    assert pinned["schemaVersion"] == 2
    assert pinned["manifests"] == [
        _entry(D2, pinned_ref_name(D2)),
        _entry(D1, "pin-sha256-" + "1" * 64, **{SOURCE_ANNOTATION: "127.0.0.1:5000/b:v1"}),
    ]
    assert entries(index)[1] == _entry(D1, "incoming-1-ab")  # the input is left as it was


def entries(index: Mapping[str, object]) -> list[dict[str, Any]]:
    return cast("list[dict[str, Any]]", index["manifests"])


def test_a_tag_pulled_again_after_it_moved_pins_the_new_digest_beside_the_old() -> None:
    """What a running serve pinned stays in the store: the new pull only adds its own pin."""
    first, d1 = pin_incoming({"manifests": [_entry(D1, "incoming-a")]}, "incoming-a", "r/b:v1")
    moved = {**first, "manifests": [*entries(first), _entry(D2, "incoming-b")]}
    second, d2 = pin_incoming(moved, "incoming-b", "r/b:v1")
    names = {m["annotations"][REF_NAME]: m["digest"] for m in entries(second)}
    assert (d1, d2) == (D1, D2)
    assert names == {pinned_ref_name(D1): D1, pinned_ref_name(D2): D2}


def test_the_same_content_pulled_twice_keeps_one_pin() -> None:
    first, _ = pin_incoming({"manifests": [_entry(D1, "incoming-a")]}, "incoming-a", "a")
    again = {"manifests": [*entries(first), _entry(D1, "incoming-b")]}
    second, _ = pin_incoming(again, "incoming-b", "oci-archive:/x.tar")
    assert [m["annotations"] for m in entries(second)] == [
        {REF_NAME: pinned_ref_name(D1), SOURCE_ANNOTATION: "oci-archive:/x.tar"}
    ]


def test_a_copy_the_index_does_not_name_once_is_an_error() -> None:
    with pytest.raises(ImageSourceError):
        pin_incoming({"manifests": []}, "incoming-a", "a")
    with pytest.raises(ImageSourceError):
        pin_incoming({"manifests": [_entry("md5:00", "incoming-a")]}, "incoming-a", "a")


def test_drop_takes_out_one_name() -> None:
    index = {"manifests": [_entry(D1, pinned_ref_name(D1)), _entry(D2, pinned_ref_name(D2)), _entry(D2, "x")]}
    assert [m["digest"] for m in entries(drop_ref(index, "x"))] == [D1, D2]


def test_only_linux_amd64_runs() -> None:
    assert platform_problem({"os": "linux", "architecture": "amd64"}) is None
    problem = platform_problem({"os": "linux", "architecture": "arm64"})
    assert problem is not None
    assert "linux/arm64" in problem
    assert platform_problem({}) is not None


REGISTRY = parse("127.0.0.1:5000/busybox:v1")
OCI_ARCHIVE = parse("oci-archive:/tmp/bb.oci.tar")
DOCKER_ARCHIVE = parse("docker-archive:/tmp/bb.docker.tar")


def fatal(message: str) -> str:
    escaped = message.replace('"', '\\"')
    return f'time="2026-12-07T15:02:18Z" level=fatal msg="{escaped}"\n'


def test_skopeos_message_is_its_last_fatal_line() -> None:
    stderr = 'level=warning msg="retrying"\n' + fatal('reading "x": manifest unknown')
    assert skopeo_message(stderr) == 'reading "x": manifest unknown'
    assert skopeo_message("plain failure\n\n") == "plain failure"


@pytest.mark.parametrize(
    ("source", "stderr", "kind"),
    [
        # What skopeo 1.9 said against a local docker-registry 2.8 (TLS, htpasswd).
        (REGISTRY, fatal("initializing source docker://127.0.0.1:5000/busybox:v9: reading manifest v9 in "
                         "127.0.0.1:5000/busybox: manifest unknown: manifest unknown"), ImageNotFoundError),
        (REGISTRY, fatal("initializing source docker://127.0.0.1:5000/busybox:v1: reading manifest v1 in "
                         "127.0.0.1:5000/busybox: unauthorized: authentication required"), RegistryAuthError),
        (REGISTRY, fatal("initializing source docker://127.0.0.1:5000/busybox:v1: pinging container registry "
                         '127.0.0.1:5000: Get "https://127.0.0.1:5000/v2/": x509: certificate signed by '
                         "unknown authority"), RegistryTrustError),
        (REGISTRY, fatal("writing blob: fetching blob: received unexpected HTTP status: 503 Service "
                         "Unavailable"),
         RegistryUnavailableError),
        (REGISTRY, fatal("initializing source docker://127.0.0.1:5000/busybox:v1: reading manifest v1 in "
                         "127.0.0.1:5000/busybox: toomanyrequests: slow down"), RegistryUnavailableError),
        (REGISTRY, fatal('pinging container registry 127.0.0.1:5000: Get "https://127.0.0.1:5000/v2/": '
                         "dial tcp 127.0.0.1:5000: connect: connection refused"), RegistryUnavailableError),
        (REGISTRY, fatal("choosing an image from manifest list docker://127.0.0.1:5000/busybox:v1: no "
                         'image found in manifest list for architecture amd64, variant "", OS linux'),
         ImagePlatformError),
        (REGISTRY, fatal("something nobody expected"), ImageSourceError),
        (OCI_ARCHIVE, fatal("initializing source oci-archive:/tmp/bb.oci.tar:: creating temp directory: "
                            'untarring file "/var/tmp/oci3143139674": unexpected EOF'), ImageArchiveError),
        (OCI_ARCHIVE, fatal("initializing source oci-archive:/tmp/none.tar:: creating temp directory: open "
                            "/tmp/none.tar: no such file or directory"), ImageNotFoundError),
        (OCI_ARCHIVE, fatal('initializing source oci-archive:/tmp/bb.oci.tar:nope: no descriptor found for '
                            'reference "nope"'), ImageNotFoundError),
        (DOCKER_ARCHIVE, fatal("initializing source docker-archive:/tmp/bb.docker.tar: loading tar component "
                               "manifest.json: unexpected EOF"), ImageArchiveError),
        (DOCKER_ARCHIVE, fatal("determining manifest MIME type for docker-archive:/tmp/bb.docker.tar:"
                               'docker.io/library/busybox:v2: Tag "docker.io/library/busybox:v2" not found'),
         ImageNotFoundError),
        (DOCKER_ARCHIVE, fatal("writing blob: happened: Digest did not match, expected sha256:aa, got "
                               "sha256:bb"),
         ImageArchiveError),
    ],
)  # fmt: skip
def test_skopeos_failures_are_typed(source: ImageSource, stderr: str, kind: type[ImageSourceError]) -> None:
    error = classify_pull_failure(source, stderr)
    assert type(error) is kind
    assert source.name in str(error)
    assert skopeo_message(stderr) in str(error)  # what skopeo said is kept, after what to do


def test_the_messages_say_what_to_do() -> None:
    auth = classify_pull_failure(REGISTRY, fatal("unauthorized: authentication required"))
    assert "--registry-auth-file" in str(auth)
    trust = classify_pull_failure(REGISTRY, fatal("x509: certificate signed by unknown authority"))
    assert "--registry-cert-dir" in str(trust)
    archive = classify_pull_failure(OCI_ARCHIVE, fatal("untarring file: unexpected EOF"))
    assert "truncated or corrupt" in str(archive)
