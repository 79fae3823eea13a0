"""A Harbor task's Dockerfile made buildable offline: FROM rewrites, notes, buildah's argv, failed steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandfleet.adapters.harbor_dockerfile import (
    DockerfileError,
    build_error,
    buildah_argv,
    registry_host,
    registry_of,
    rewrite_from,
    steps,
)

BASE = "oci-archive:/cache/base.oci.tar"


def unreachable(registry: str) -> bool:
    return False


@pytest.mark.parametrize(
    ("image", "registry"),
    [
        ("ubuntu:24.04", "docker.io"),
        ("library/python:3.12", "docker.io"),
        ("ghcr.io/laude-institute/t-bench/python-3-13:20250620", "ghcr.io"),
        ("localhost/base", "localhost"),
        ("127.0.0.1:5000/base:1", "127.0.0.1:5000"),
        ("docker://quay.io/x/y", "quay.io"),
    ],
)
def test_the_registry_an_image_names_is_read_as_docker_reads_it(image: str, registry: str) -> None:
    assert registry_of(image) == registry


def test_docker_hub_is_probed_at_its_real_host_and_a_named_port_is_kept() -> None:
    assert registry_host("docker.io") == ("registry-1.docker.io", 443)
    assert registry_host("127.0.0.1:5000") == ("127.0.0.1", 5000)


def test_a_from_whose_registry_cannot_be_reached_is_rewritten_to_the_base_with_a_note() -> None:
    text = "FROM --platform=linux/amd64 ubuntu:24.04 AS build\nRUN make\nFROM build\nCOPY . /app\n"
    asked: list[str] = []

    def reachable(registry: str) -> bool:
        asked.append(registry)
        return False

    rewrite = rewrite_from(text, BASE, reachable)
    assert rewrite.text.splitlines() == [
        f"FROM --platform=linux/amd64 {BASE} AS build",
        "RUN make",
        "FROM build",
        "COPY . /app",
    ]
    assert rewrite.notes == [f"FROM ubuntu:24.04 rewritten to FROM {BASE} (docker.io cannot be reached)"]
    assert asked == ["docker.io"]


def test_reachable_registries_scratch_and_local_references_are_kept_and_each_registry_asked_once() -> None:
    text = "FROM ghcr.io/a/b:1\nFROM ghcr.io/a/c:2\nFROM scratch\nFROM oci-archive:/x.tar\nFROM ubuntu\n"
    asked: list[str] = []

    def reachable(registry: str) -> bool:
        asked.append(registry)
        return registry == "ghcr.io"

    rewrite = rewrite_from(text, BASE, reachable)
    assert rewrite.text.splitlines()[:4] == ["FROM ghcr.io/a/b:1", "FROM ghcr.io/a/c:2", "FROM scratch",
                                             "FROM oci-archive:/x.tar"]  # fmt: skip
    assert rewrite.text.splitlines()[4] == f"FROM {BASE}"
    assert asked == ["ghcr.io", "docker.io"]


def test_without_a_base_an_unreachable_from_says_what_to_pass() -> None:
    with pytest.raises(DockerfileError, match=r"FROM ubuntu:24.04 names docker.io, .* \(--base oci-archive:"):
        rewrite_from("FROM ubuntu:24.04\n", None, unreachable)
    with pytest.raises(DockerfileError, match="without an image"):
        rewrite_from("FROM --platform=linux/amd64\n", BASE, unreachable)


def test_steps_are_the_instructions_with_continuations_joined_and_comments_dropped() -> None:
    text = "# syntax\nFROM x\n\nRUN apt-get update && \\\n    apt-get install -y curl\nWORKDIR /app\n"
    assert steps(text) == ["FROM x", "RUN apt-get update &&      apt-get install -y curl", "WORKDIR /app"]


def test_buildah_runs_daemonless_in_its_own_storage_with_no_network_for_run_steps(tmp_path: Path) -> None:
    argv = buildah_argv(tmp_path / "Dockerfile", tmp_path / "ctx", "oci-archive:/o.tar", tmp_path / "s")
    assert argv[:7] == ["buildah", "--root", str(tmp_path / "s/root"), "--runroot", str(tmp_path / "s/run"),
                        "--storage-driver", "vfs"]  # fmt: skip
    assert {"build", "--network=none", "--isolation=oci", "--pull=missing"} <= set(argv)
    assert argv[-3:] == ["-t", "oci-archive:/o.tar", str(tmp_path / "ctx")]


# buildah 1.28's output for a RUN that wanted the network (trimmed).
NETWORK_FAILURE = """STEP 1/4: FROM oci-archive:/cache/base.oci.tar
STEP 2/4: WORKDIR /app
STEP 3/4: RUN echo ok
ok
STEP 4/4: RUN pip download --no-deps -d /tmp/p six
WARNING: Retrying ... Failed to establish a new connection: [Errno -3] Temporary failure in name resolution
ERROR: No matching distribution found for six
Error: building at STEP "RUN pip download --no-deps -d /tmp/p six": while running runtime: exit status 1
"""
DOCKERFILE = "FROM ubuntu\nWORKDIR /app\nRUN echo ok\nRUN pip download --no-deps -d /tmp/p six\n"


def test_a_step_that_needed_the_network_is_named_with_its_number_and_the_way_out() -> None:
    message = build_error(NETWORK_FAILURE, steps(DOCKERFILE))
    assert message.startswith(
        "step 4/4 failed: RUN pip download --no-deps -d /tmp/p six (while running runtime: exit status 1); "
        "it needed the network"
    )
    assert "--base" in message


def test_a_step_that_failed_otherwise_is_named_without_blaming_the_network() -> None:
    output = NETWORK_FAILURE.replace("Temporary failure in name resolution", "").replace(
        "Failed to establish a new connection", "syntax error"
    )
    assert build_error(output, steps(DOCKERFILE)) == (
        "step 4/4 failed: RUN pip download --no-deps -d /tmp/p six (while running runtime: exit status 1)"
    )


def test_a_failure_outside_any_step_gives_buildahs_last_line() -> None:
    assert build_error("STEP 1/1: FROM x\nError: creating build container: no such image\n", ["FROM x"]) == (
        "buildah failed: Error: creating build container: no such image"
    )
    assert build_error("", []) == "buildah failed: no output"


def test_offline_rewrites_every_registry_from_without_asking() -> None:
    def reachable(registry: str) -> bool:
        raise AssertionError("offline asks no registry")

    rewrite = rewrite_from("FROM ghcr.io/a/b:1\nFROM scratch\n", BASE, reachable, offline=True)
    assert rewrite.text == f"FROM {BASE}\nFROM scratch\n"
    assert rewrite.notes == [f"FROM ghcr.io/a/b:1 rewritten to FROM {BASE} (--offline)"]
    with pytest.raises(DockerfileError, match=r"ghcr.io, which is not used \(--offline\)"):
        rewrite_from("FROM ghcr.io/a/b:1\n", None, reachable, offline=True)


def test_a_base_in_a_private_registry_gets_its_credentials_and_ca(tmp_path: Path) -> None:
    argv = buildah_argv(
        tmp_path / "D",
        tmp_path,
        "oci-archive:/o.tar",
        tmp_path,
        auth_file=Path("/a.json"),
        cert_dir=Path("/ca"),
    )
    assert argv[argv.index("--authfile") + 1] == "/a.json"
    assert argv[argv.index("--cert-dir") + 1] == "/ca"
    assert "--authfile" not in buildah_argv(tmp_path / "D", tmp_path, "oci-archive:/o.tar", tmp_path)
