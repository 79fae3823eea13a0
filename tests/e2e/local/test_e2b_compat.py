"""The real `e2b` SDK from PyPI, unmodified, against a real `sandfleet serve --local` over gVisor sandboxes.

The SDK is pointed at the gateway by its own settings only (E2B_API_URL, E2B_SANDBOX_URL,
E2B_API_KEY); everything below is plain SDK code, checked against the gateway's own lease API.
`template=` names a pool, or an image that serve serves: a local layout by its tag, an image pulled
from the test registry (TLS, basic auth) by its reference.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from e2b import CommandExitException, Sandbox, SandboxException, SandboxQuery

from sandfleet.local.artifacts import ImageRef
from sandfleet.local.pull import STORE_ENV
from tests.support.foreign_images import (
    BULLSEYE_MARKER,
    BULLSEYE_WORKDIR,
    BUSYBOX_MARKER,
    BUSYBOX_PATH,
    BUSYBOX_WORKDIR,
    build_foreign_image,
)
from tests.support.registry import start_registry
from tests.support.servers import start_local_serve, stop_local_serve

pytestmark = pytest.mark.gvisor

TOKENS = {"actor-0": "local-token", "actor-1": "other-token"}
POOL = "python"  # start_local_serve's pool


@pytest.fixture(scope="module")
def gateway(runsc: Path, base_image: ImageRef, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url, process, log = start_local_serve(tmp_path_factory.mktemp("e2b"), TOKENS)
    yield url
    stop_local_serve(process, log)


@pytest.fixture
def e2b_env(gateway: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The SDK's documented settings, pointing it at the gateway as tenant actor-0."""
    for name in ("E2B_DEBUG", "E2B_DOMAIN", "E2B_ACCESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("E2B_API_URL", f"{gateway}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{gateway}/e2b/envd")
    monkeypatch.setenv("E2B_API_KEY", TOKENS["actor-0"])
    return gateway


@dataclass(frozen=True)
class Foreign:
    url: str
    pulled: str  # the registry image's reference, as leases (and templates) name it
    digests: dict[str, str]  # template -> the manifest digest its leases must report


@pytest.fixture(scope="module")
def foreign_gateway(runsc: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Foreign]:
    """serve --local of busybox (a layout) and bullseye pulled from the local registry, one warm each."""
    directory = tmp_path_factory.mktemp("e2b-foreign")
    busybox, bullseye = build_foreign_image("busybox"), build_foreign_image("bullseye")
    registry = start_registry(directory / "registry")
    try:
        pushed = registry.push(f"oci:{bullseye.layout_ref}", "bullseye:v1")
        pulled = f"{registry.host}/bullseye:v1"
        url, process, log = start_local_serve(
            directory,
            TOKENS,
            warm=1,
            extra_args=[
                *("--image", f"{busybox.layout}:{busybox.tag}", "--image", pulled),
                *("--registry-auth-file", str(registry.auth_file)),
                *("--registry-cert-dir", str(registry.cert_dir)),
            ],
            settings={STORE_ENV: str(directory / "store")},
            timeout=300,
        )
        try:
            yield Foreign(url, pulled, {busybox.tag: busybox.digest, pulled: pushed})
        finally:
            stop_local_serve(process, log)
    finally:
        registry.stop()


def lease(gateway: str, lease_id: str, token: str = TOKENS["actor-0"]) -> httpx.Response:
    return httpx.get(
        f"{gateway}/v1/leases/{lease_id}", headers={"Authorization": f"Bearer {token}"}, trust_env=False
    )


def test_create_run_files_timeout_kill(e2b_env: str) -> None:
    sandbox = Sandbox.create(template=POOL, timeout=120, metadata={"episode": "e2b-1"})
    try:
        held = lease(e2b_env, sandbox.sandbox_id)
        assert held.status_code == 200, held.text
        assert held.json()["lease"]["labels"]["episode"] == "e2b-1"
        assert held.json()["lease"]["ttl_seconds"] == 120
        found = Sandbox.list(query=SandboxQuery(metadata={"episode": "e2b-1"})).next_items()
        assert [listed.sandbox_id for listed in found] == [sandbox.sandbox_id]
        assert Sandbox.list(query=SandboxQuery(metadata={"episode": "another"})).next_items() == []

        # commands.run, blocking: stdout, stderr and the exit code, through bash as E2B runs it
        numbers = [3, 4, 5]
        result = sandbox.commands.run(f"python3 -c 'print(sum({numbers}))'; echo to-stderr >&2")
        assert result.exit_code == 0
        assert result.stdout == f"{sum(numbers)}\n"
        assert result.stderr == "to-stderr\n"
        with pytest.raises(CommandExitException) as failed:
            sandbox.commands.run("echo partial; exit 7")
        assert failed.value.exit_code == 7
        assert failed.value.stdout == "partial\n"
        assert sandbox.commands.run("echo $GREETING", envs={"GREETING": "hi there"}).stdout == "hi there\n"

        # files: write (multipart and bytes), read back, list, exists, make_dir, remove
        text = f"written at {time.time()}\n"
        sandbox.files.write("notes/a.txt", text)
        assert sandbox.files.read("notes/a.txt") == text
        blob = os.urandom(4096)
        sandbox.files.write("notes/blob.bin", blob)
        assert bytes(sandbox.files.read("notes/blob.bin", format="bytes")) == blob
        # a file-like body goes octet-stream and streams through: past the 1 MiB control-body cap
        big = os.urandom(3 << 20)
        sandbox.files.write("big.bin", io.BytesIO(big))
        assert bytes(sandbox.files.read("big.bin", format="bytes")) == big
        assert sandbox.commands.run("cat notes/a.txt").stdout == text  # the same filesystem
        listed = {entry.name: entry for entry in sandbox.files.list("notes")}
        assert set(listed) == {"a.txt", "blob.bin"}
        assert listed["blob.bin"].size == len(blob)
        assert listed["a.txt"].path == "/workspace/notes/a.txt"
        assert sandbox.files.exists("notes/a.txt")
        assert not sandbox.files.exists("notes/missing.txt")
        assert sandbox.files.make_dir("notes/sub")
        assert not sandbox.files.make_dir("notes/sub")  # already there
        sandbox.files.remove("notes/a.txt")
        assert not sandbox.files.exists("notes/a.txt")

        # set_timeout is the lease's TTL, from now
        sandbox.set_timeout(300)
        assert lease(e2b_env, sandbox.sandbox_id).json()["lease"]["ttl_seconds"] == 300
        info = sandbox.get_info()
        left = (info.end_at - datetime.now(UTC)).total_seconds()
        assert 300 - 30 < left <= 300
        assert info.template_id == POOL
        assert sandbox.is_running()
    finally:
        sandbox.kill()
    # kill released the lease: it is gone for the SDK and for the gateway
    assert lease(e2b_env, sandbox.sandbox_id).status_code in (404, 410)
    assert Sandbox.kill(sandbox.sandbox_id) is False


def test_streamed_output_arrives_while_the_command_runs(e2b_env: str) -> None:
    sandbox = Sandbox.create(template=POOL)
    try:
        seen: list[tuple[float, str]] = []
        lines, pause = 3, 1.0
        result = sandbox.commands.run(
            f"for i in $(seq {lines}); do echo line-$i; sleep {pause}; done",
            on_stdout=lambda chunk: seen.append((time.monotonic(), chunk)),
        )
        done = time.monotonic()
        assert "".join(chunk for _, chunk in seen) == result.stdout
        assert result.stdout.splitlines() == [f"line-{i}" for i in range(1, lines + 1)]
        # the first line was handed over while the command still had (lines - 1) pauses to go
        assert done - seen[0][0] > (lines - 1) * pause * 0.8

        handle = sandbox.commands.run("sleep 0.5; echo later", background=True)
        assert handle.wait().stdout == "later\n"
    finally:
        sandbox.kill()


def test_another_tenant_cannot_reach_the_sandbox(e2b_env: str) -> None:
    mine = Sandbox.create(template=POOL)
    try:
        secret = f"mine-{time.time()}"
        mine.files.write("secret.txt", secret)
        other = TOKENS["actor-1"]
        with pytest.raises(SandboxException):
            Sandbox.connect(mine.sandbox_id, api_key=other)
        with pytest.raises(SandboxException):
            Sandbox.kill(mine.sandbox_id, api_key=other)
        with pytest.raises(SandboxException):
            Sandbox.set_timeout(mine.sandbox_id, 5, api_key=other)
        assert Sandbox.list(api_key=other).next_items() == []
        # envd with the other tenant's key: refused, whatever the sandbox header says
        envd = f"{e2b_env}/e2b/envd"
        theirs = {"X-Access-Token": other, "E2b-Sandbox-Id": mine.sandbox_id}
        read = httpx.get(f"{envd}/files", params={"path": "secret.txt"}, headers=theirs, trust_env=False)
        assert read.status_code == 403, read.text
        assert secret not in read.text
        run = httpx.post(
            f"{envd}/process.Process/Start",
            headers={**theirs, "Content-Type": "application/connect+json"},
            content=b"\x00\x00\x00\x00\x02{}",
            trust_env=False,
        )
        assert b"permission_denied" in run.content
        # no key at all: refused before anything is read
        assert httpx.get(f"{envd}/files", params={"path": "secret.txt"}, trust_env=False).status_code == 401
        # the owner is untouched
        assert mine.files.read("secret.txt") == secret
        assert lease(e2b_env, mine.sandbox_id).status_code == 200
    finally:
        mine.kill()


@pytest.mark.parametrize("image", ["busybox", "pulled"])
def test_a_template_that_is_an_image_runs_with_its_environment_and_workdir(
    foreign_gateway: Foreign, monkeypatch: pytest.MonkeyPatch, image: str
) -> None:
    """Unmodified SDK: `template=` a foreign image; commands see its Env and WorkingDir; files work."""
    for name in ("E2B_DEBUG", "E2B_DOMAIN", "E2B_ACCESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("E2B_API_URL", f"{foreign_gateway.url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{foreign_gateway.url}/e2b/envd")
    monkeypatch.setenv("E2B_API_KEY", TOKENS["actor-0"])
    template, marker, workdir = {
        "busybox": ("busybox", BUSYBOX_MARKER, BUSYBOX_WORKDIR),  # a layout: leased by its tag
        "pulled": (foreign_gateway.pulled, BULLSEYE_MARKER, BULLSEYE_WORKDIR),  # HOST:PORT/NAME:TAG
    }[image]
    sandbox = Sandbox.create(template=template, timeout=120)
    try:
        held = lease(foreign_gateway.url, sandbox.sandbox_id)
        assert held.status_code == 200, held.text
        assert held.json()["lease"]["image_digest"] == foreign_gateway.digests[template], held.text
        assert sandbox.get_info().template_id == template
        shown = sandbox.commands.run("echo $MARKER; pwd; echo $PATH")
        assert shown.stdout.splitlines()[:2] == [marker, workdir], shown
        if image == "busybox":
            assert shown.stdout.splitlines()[2] == BUSYBOX_PATH
        text = f"from the sdk at {time.time()}\n"
        sandbox.files.write("notes/e2b.txt", text)
        assert sandbox.files.read("notes/e2b.txt") == text
        assert sandbox.files.read(f"{workdir}/notes/e2b.txt") == text  # the working directory's
        assert sandbox.commands.run("cat notes/e2b.txt").stdout == text
        sandbox.commands.run("echo by-the-command > made.txt")
        assert sandbox.files.read("made.txt") == "by-the-command\n"
        # Listed where they are: in the image's working directory, not sandfleet's /workspace.
        listed = {entry.path for entry in sandbox.files.list(workdir)}
        assert {f"{workdir}/notes", f"{workdir}/made.txt"} <= listed, listed
    finally:
        sandbox.kill()
