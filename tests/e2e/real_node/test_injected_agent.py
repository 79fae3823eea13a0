"""Any image is a sandbox on the real gVisor node: the operator injects the agent (spec.template.agent).

A busybox-only image (tests/support/foreign_images.py: no python, no libc, its own PATH, a variable,
a WorkingDir, a user squatting the first id the agent would take) is imported into the node's
containerd, a pool of it is filled by a real operator and leased through a real gateway (both on
this host, against the real-node cluster), and its commands see the image's Env and WorkingDir.
The cold start of such a Pod is measured against the sandbox image's own agent, in the same run.

The node's containerd also pulls: a local registry (Debian's docker-registry, TLS and basic auth,
tests/support/registry.py) serves the foreign images; the node trusts its CA (`hack/cluster
trust-registry`) and the pool's imagePullSecrets carry the credentials. A pool whose image cannot be
pulled (wrong password) says so in its Degraded condition, and leaves nothing behind. Pools of the
musl, distroless and bullseye images pulled from it are leased by the gateway API, the `sandfleet`
CLI and the unmodified e2b SDK (`template=` the image's reference), each command seeing the image's
Env and WorkingDir; and bullseye's setuid-root `id` gives a command no root (no_new_privs).
"""

from __future__ import annotations

import base64
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox as E2BSandbox

from sandfleet.client import Fleet
from sandfleet.controller.settings import DEFAULT_AGENT_BUNDLE_IMAGE
from sandfleet.core import api
from sandfleet.core.model import pool_from_object
from sandfleet.core.pods import AgentBundleImage, sandbox_pod
from sandfleet.core.timestamps import parse_time
from sandfleet.local.injection import AGENT_ID_BASE
from tests.e2e.real_node.cluster import REAL_NODE_LABEL, REPO, RealCluster
from tests.support.agent_key import fleet_key_file
from tests.support.foreign_images import (
    BULLSEYE_GLIBC,
    BULLSEYE_MARKER,
    BULLSEYE_SETUID_ID,
    BULLSEYE_WORKDIR,
    BUSYBOX_MARKER,
    BUSYBOX_PATH,
    BUSYBOX_WORKDIR,
    MUSL_LOADER,
    build_conda_image,
    build_foreign_image,
)
from tests.support.kube import Kubectl, wait_until
from tests.support.registry import PASSWORD, USER, LocalRegistry, start_registry
from tests.support.servers import free_port, wait_until_ready

FOREIGN_REF = "example.test/foreign/busybox:1"
BUNDLE = AgentBundleImage(DEFAULT_AGENT_BUNDLE_IMAGE, "Never")  # `up --real-node` imports it
POOL = "foreign"
TOKEN = "injected-token"
REGION = "us-east1"
SANDFLEET = [sys.executable, "-m", "sandfleet.cli"]
# Pods timed one at a time for each image, alternating, in the same run.
COLD_STARTS = 5
PULLED_POOL = "pulled"
UNPULLABLE_POOL = "unpullable"
ROOT_POOL = "as-root"
PULL_SECRET = "registry"
# Where the registry keeps the foreign images: busybox (also imported with ctr: the same blobs) for
# the pools, musl (nothing of it on the node) for the cold pulls.
PULLED_BUSYBOX = "foreign/busybox:1"
PULLED_MUSL = "foreign/musl:1"
# The cold-pull test's image: musl; with SANDFLEET_COLD_PULL_IMAGE=conda the benchmark's 1 GB conda
# image instead (build_conda_image: minutes to build the first time, then cached), in
# SANDFLEET_COLD_PULL_ROUNDS rounds (default COLD_STARTS).
PULLED_CONDA = "foreign/conda:1"
COLD_PULL_CONDA = os.environ.get("SANDFLEET_COLD_PULL_IMAGE") == "conda"
COLD_PULL_ROUNDS = int(os.environ.get("SANDFLEET_COLD_PULL_ROUNDS") or COLD_STARTS)
# How long a Pod may take to be Ready, and `ctr` to pull: a gigabyte's pull and unpack takes longer.
COLD_PULL_LIMIT_S = 600 if COLD_PULL_CONDA else 120


@dataclass(frozen=True)
class PulledImage:
    """A foreign image the node pulls for a pool of its own, and what its commands must see."""

    name: str  # in IMAGES; the pool's name is `pulled-NAME`
    repository: str  # where the registry keeps it
    path: str  # the image's PATH
    workdir: str  # its WorkingDir (sandfleet's /workspace for an image without one)
    marker: str  # its MARKER variable ("" for none)
    shell: tuple[str, ...]  # how a command line runs there: its own shell, or busybox's (distroless)

    @property
    def pool(self) -> str:
        return f"pulled-{self.name}"

    def probe(self) -> list[str]:
        """A command printing what the image's config gives a command: PATH, MARKER, the cwd."""
        return [*self.shell, 'echo "$PATH|$MARKER|$(pwd)"']

    @property
    def expected(self) -> str:
        return f"{self.path}|{self.marker}|{self.workdir}\n"


# One pool of each, pulled from the local registry by TestPulledImagesByEveryClient and deleted
# after it (the cold-pull test forgets the musl image's digest, whatever the name).
PULLED_IMAGES = {
    image.name: image
    for image in (
        PulledImage(
            "musl", "foreign/musl-pool:1", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "/workspace", "", ("sh", "-c"),
        ),
        PulledImage("distroless", "foreign/distroless:1", "/app", "/app", "", ("busybox", "sh", "-c")),
        PulledImage(
            "bullseye", "foreign/bullseye:1", "/usr/local/bin:/usr/bin:/bin", BULLSEYE_WORKDIR,
            BULLSEYE_MARKER, ("bash", "-c"),
        ),
    )
}  # fmt: skip


def _oci_archive(layout: Path, into: Path) -> Path:
    """The foreign image's OCI layout as an oci-archive (what `ctr images import` reads)."""
    archive = into / "foreign-busybox.oci.tar"
    with tarfile.open(archive, "w") as tar:
        for path in sorted(layout.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(layout)), recursive=False)
    return archive


def _pool(
    image: str,
    agent: str,
    name: str = POOL,
    replicas: int = 1,
    pull_policy: str = "Never",
    pull_secrets: tuple[str, ...] = (),
) -> dict[str, Any]:
    pool: dict[str, Any] = {
        "apiVersion": api.API_VERSION,
        "kind": api.POOL_KIND,
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "regions": [{"name": REGION}],
            "template": {
                "image": image,
                "imagePullPolicy": pull_policy,
                "agent": agent,
                "nodeSelector": {REAL_NODE_LABEL: "true"},
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
            },
        },
    }
    if pull_secrets:
        pool["spec"]["template"]["imagePullSecrets"] = [{"name": n} for n in pull_secrets]
    return pool


def _pull_secret(name: str, host: str, user: str, password: str) -> dict[str, Any]:
    """A kubernetes.io/dockerconfigjson Secret with credentials for `host`."""
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    config = {"auths": {host: {"username": user, "password": password, "auth": auth}}}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()},
    }


@dataclass
class Fleetside:
    """A namespace with the operator and the gateway of this host running against the real node."""

    kube: Kubectl
    namespace: str
    url: str

    def fleet(self) -> Fleet:
        return Fleet(url=self.url, token=TOKEN, timeout=120)


@pytest.fixture(scope="module")
def foreign_image(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The busybox-only image, imported into the node's containerd under FOREIGN_REF."""
    image = build_foreign_image("busybox")
    archive = _oci_archive(image.layout, tmp_path_factory.mktemp("foreign"))
    return real_cluster.import_image(archive, FOREIGN_REF)


@pytest.fixture(scope="module")
def registry(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    """The local registry (loopback, TLS, basic auth) with the foreign images; the node trusts its CA."""
    served = start_registry(tmp_path_factory.mktemp("registry"))
    try:
        served.push(f"oci:{build_foreign_image('busybox').layout_ref}", PULLED_BUSYBOX)
        served.push(f"oci:{build_foreign_image('musl').layout_ref}", PULLED_MUSL)
        if COLD_PULL_CONDA:
            served.push(f"oci:{build_conda_image().layout_ref}", PULLED_CONDA)
        for image in PULLED_IMAGES.values():
            served.push(f"oci:{build_foreign_image(image.name).layout_ref}", image.repository)
        real_cluster.trust_registry(served.host, served.cert_dir / "ca.crt")
        yield served
    finally:
        served.stop()
        (real_cluster.registry_hosts_dir / served.host / "hosts.toml").unlink(missing_ok=True)


def _start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def fleetside(
    real_cluster: RealCluster, foreign_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleetside]:
    """The CRDs, a namespace, `sandfleet operator` and `sandfleet gateway` on this host."""
    admin = real_cluster.kubectl
    admin("apply", "-f", str(REPO / "manifests" / "crds"))
    admin("wait", "--for=condition=Established", "crd/sandboxpools.sandfleet.dev", "--timeout=60s")
    workdir = tmp_path_factory.mktemp("injected")
    key = fleet_key_file(workdir)
    pools = [POOL, PULLED_POOL, UNPULLABLE_POOL, ROOT_POOL, *(i.pool for i in PULLED_IMAGES.values())]
    (workdir / "tokens").write_text(f"{TOKEN} tester {','.join(pools)}\n")
    env = {**os.environ, "KUBECONFIG": str(real_cluster.kubeconfig)}
    with real_cluster.namespace("inj") as kube:
        namespace = kube.namespace
        assert namespace is not None
        operator = _start(
            [*SANDFLEET, "operator", "-n", namespace, "--metrics-port", "0", "--agent-key-file", str(key),
             "--agent-bundle-image", BUNDLE.image, "--agent-bundle-pull-policy", BUNDLE.pull_policy],
            workdir / "operator.log", env,
        )  # fmt: skip
        port = free_port()
        gateway = _start(
            [*SANDFLEET, "gateway", "--host", "127.0.0.1", "--port", str(port), "-n", namespace,
             "--auth", "static", "--token-file", str(workdir / "tokens"), "--agent-key-file", str(key)],
            workdir / "gateway.log", env,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_ready(url, gateway, workdir / "gateway.log", timeout=60, what="the gateway")
            yield Fleetside(kube, namespace, url)
        finally:
            _stop(gateway)
            _stop(operator)
            kube.run("delete", "sandboxpools", "--all", "--wait=false")


def _warm(kube: Kubectl, pool: str) -> bool:
    pods = kube.json("get", "pods", "-l", f"{api.POOL_LABEL}={pool}")["items"]
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for p in pods
        for c in (p.get("status") or {}).get("conditions") or ()
    )


def test_a_foreign_image_pool_is_leased_through_the_gateway_with_the_images_config(
    fleetside: Fleetside, foreign_image: str
) -> None:
    fleetside.kube.apply(_pool(foreign_image, api.AGENT_INJECTED))
    wait_until(
        lambda: _warm(fleetside.kube, POOL),
        timeout=180,
        what="a warm sandbox of the foreign image (agent injected)",
    )
    pod = fleetside.kube.json("get", "pods", "-l", f"{api.POOL_LABEL}={POOL}")["items"][0]
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["sandfleet-agent-bundle"]
    assert pod["spec"]["containers"][0]["image"] == foreign_image
    with fleetside.fleet() as fleet, fleet.lease(POOL, ttl_seconds=300) as sandbox:
        shown = sandbox.exec(["sh", "-c", 'echo "$MARKER|$PATH|$(pwd)|$(id -u)"; env'])
        assert shown.exit_code == 0, shown
        first, _, rest = shown.stdout.partition("\n")
        # The image's Env and WorkingDir; a user the image does not name (it squats the first id).
        assert first == f"{BUSYBOX_MARKER}|{BUSYBOX_PATH}|{BUSYBOX_WORKDIR}|{AGENT_ID_BASE + 1}", shown
        # Nothing the Pod added for the agent, and nothing of the bundle, reaches a command.
        assert "SANDFLEET_AGENT" not in rest
        assert "KUBERNETES_SERVICE_HOST" not in rest
        assert ".sandfleet" not in rest
        # The files routes' root is the working area, with the image's own file in it.
        assert sandbox.exec(["cat", "hello.txt"]).stdout == "hello from the image\n"
        # The bundle is read-only to the episode.
        wrote = sandbox.exec(["sh", "-c", "echo x > /.sandfleet/bin/agent"])
        assert wrote.exit_code != 0
        # Evaluate: the bundle's git applies the patch, the image's shell runs the test.
        patch = "--- a/hello.txt\n+++ b/hello.txt\n@@ -1 +1 @@\n-hello from the image\n+hello, patched\n"
        result = sandbox.evaluate(patch=patch, shell="grep -q patched hello.txt")
        assert (result.outcome.value, result.reward) == ("passed", 1.0), result


def test_a_pool_whose_commands_run_as_root_is_scored_apart_and_pays_0_for_a_stopped_agent(
    fleetside: Fleetside, foreign_image: str
) -> None:
    """spec.template.commandsUser: root, on an image with no /etc/passwd entry for it (busybox)."""
    pool = _pool(foreign_image, api.AGENT_INJECTED, name=ROOT_POOL)
    pool["spec"]["template"]["commandsUser"] = "root"
    fleetside.kube.apply(pool)
    wait_until(lambda: _warm(fleetside.kube, ROOT_POOL), timeout=180, what="a warm sandbox run as root")
    with fleetside.fleet() as fleet, fleet.lease(ROOT_POOL, ttl_seconds=300) as sandbox:
        shown = sandbox.exec(["sh", "-c", 'echo "$(id -u)|$HOME|$(pwd)"'])
        assert shown.stdout.strip() == f"0|/root|{BUSYBOX_WORKDIR}", shown
        # A test command would run where root ran: the gateway refuses it for such a pool.
        answer = httpx.post(
            f"{fleetside.url}/v1/leases/{sandbox.lease.id}/evaluate",
            json={"shell": "true"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=60,
        )
        assert (answer.status_code, answer.json()["error"]) == (422, "bad_task"), answer.text
        # Root stops the agent (gVisor lets it SIGKILL its init): the episode's zero, not a mask.
        sandbox.exec(["sh", "-c", "(sleep 0.5; kill -KILL 1) >/dev/null 2>&1 &"])
        time.sleep(3)
        task = {"tree": ".", "pristine": "/srv", "deciding": ["t::t"]}
        result = None
        for _ in range(30):  # until the gateway has seen the Pod go
            result = sandbox.score(task=task)
            if "stopped answering" in str(result.reason):
                break
            time.sleep(1)
        assert result is not None
        assert (result.outcome.value, result.reward) == ("failed", 0.0), result.reason
        assert "stopped answering" in str(result.reason), result.reason
    fleetside.kube.run("delete", "sandboxpool", ROOT_POOL, "--wait=false")


def test_the_node_pulls_a_pool_image_from_a_private_registry_with_the_pools_secret(
    fleetside: Fleetside, registry: LocalRegistry
) -> None:
    kube = fleetside.kube
    kube.apply(_pull_secret(PULL_SECRET, registry.host, USER, PASSWORD))
    image = f"{registry.host}/{PULLED_BUSYBOX}"
    # Always: the kubelet asks the registry (with the Secret's credentials) whatever the node holds.
    kube.apply(
        _pool(image, api.AGENT_INJECTED, PULLED_POOL, pull_policy="Always", pull_secrets=(PULL_SECRET,))
    )
    wait_until(lambda: _warm(kube, PULLED_POOL), timeout=180, what="a warm sandbox of the pulled image")
    pod = kube.json("get", "pods", "-l", f"{api.POOL_LABEL}={PULLED_POOL}")["items"][0]
    (status,) = pod["status"]["containerStatuses"]
    # The digest the registry gave the push is the one the node runs.
    assert status["imageID"].endswith(registry.pushed[PULLED_BUSYBOX]), status
    events = kube("get", "events", "--field-selector", f"involvedObject.name={pod['metadata']['name']}")
    assert "Pulled" in events, events
    with fleetside.fleet() as fleet, fleet.lease(PULLED_POOL, ttl_seconds=120) as sandbox:
        shown = sandbox.exec(["sh", "-c", 'echo "$MARKER|$(pwd)"'])
        assert shown.stdout == f"{BUSYBOX_MARKER}|{BUSYBOX_WORKDIR}\n", shown
    kube.run("delete", "sandboxpool", PULLED_POOL, "--wait=false")


def _e2b_settings(monkeypatch: pytest.MonkeyPatch, gateway: str) -> None:
    """The unmodified SDK's own settings, pointing it at the gateway as the tester."""
    for name in ("E2B_DEBUG", "E2B_DOMAIN", "E2B_ACCESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("E2B_API_URL", f"{gateway}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{gateway}/e2b/envd")
    monkeypatch.setenv("E2B_API_KEY", TOKEN)


@pytest.fixture(scope="class")
def references(fleetside: Fleetside, registry: LocalRegistry) -> Iterator[dict[str, str]]:
    """The pools of PULLED_IMAGES, filled (one warm each), for one class of tests (deleted after it:
    the cold-pull test forgets images); each image's reference by its name."""
    kube = fleetside.kube
    kube.apply(_pull_secret(PULL_SECRET, registry.host, USER, PASSWORD))
    references = {name: f"{registry.host}/{image.repository}" for name, image in PULLED_IMAGES.items()}
    try:
        for name, image in PULLED_IMAGES.items():
            body = _pool(
                references[name], api.AGENT_INJECTED, image.pool,
                pull_policy="IfNotPresent", pull_secrets=(PULL_SECRET,),
            )  # fmt: skip
            kube.apply(body)
        for image in PULLED_IMAGES.values():
            wait_until(
                partial(_warm, kube, image.pool), timeout=180, what=f"a warm sandbox of {image.name}, pulled"
            )
        yield references
    finally:
        for image in PULLED_IMAGES.values():
            kube.run("delete", "sandboxpool", image.pool, "--wait=false")


class TestPulledImagesByEveryClient:
    """musl, distroless and bullseye (glibc 2.31, no python) pulled from the local registry, one pool
    of each, leased by the gateway API (Fleet), the `sandfleet` CLI and the unmodified e2b SDK
    (`template=` the image's reference): their commands see the image's Env and WorkingDir."""

    @pytest.mark.parametrize("name", list(PULLED_IMAGES))
    def test_the_gateway_api(self, fleetside: Fleetside, references: dict[str, str], name: str) -> None:
        image = PULLED_IMAGES[name]
        with (
            fleetside.fleet() as fleet,
            fleet.lease(image.pool, image=references[name], wait_seconds=120, ttl_seconds=120) as sandbox,
        ):
            assert sandbox.lease.image_digest.startswith("sha256:"), sandbox.lease
            shown = sandbox.exec(image.probe())
            assert (shown.exit_code, shown.stdout) == (0, image.expected), shown
            # And it is that image, run by its own programs.
            own = {
                "musl": f"{MUSL_LOADER} 2>&1 | head -1; ls /lib64 >/dev/null 2>&1 || echo no-glibc",
                "distroless": "ls /bin /etc >/dev/null 2>&1 || echo no-shell-no-etc",
                "bullseye": "ldd --version | head -1; command -v python3 python || echo no-python",
            }[name]
            seen = sandbox.exec([*image.shell, own]).stdout.splitlines()
            expected = {
                "musl": ["musl libc (x86_64)", "no-glibc"],
                "distroless": ["no-shell-no-etc"],
                "bullseye": [seen[0], "no-python"],
            }
            assert seen == expected[name], seen
            if name == "bullseye":
                assert seen[0].endswith(f" {BULLSEYE_GLIBC}"), seen

    @pytest.mark.parametrize("name", list(PULLED_IMAGES))
    def test_the_cli(self, fleetside: Fleetside, references: dict[str, str], name: str) -> None:
        """`sandfleet lease POOL --image REF`, `exec`, `release`: what a user types."""
        image = PULLED_IMAGES[name]
        env = {**os.environ, "SANDFLEET_URL": fleetside.url, "SANDFLEET_TOKEN": TOKEN}

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*SANDFLEET, *args], env=env, capture_output=True, text=True, timeout=180, check=False
            )

        leased = cli("lease", image.pool, "--image", references[name], "--wait", "120")
        assert leased.returncode == 0, leased.stderr
        lease_id = leased.stdout.strip()
        try:
            ran = cli("exec", lease_id, "--", *image.probe())
            assert (ran.returncode, ran.stdout) == (0, image.expected), (ran.stdout, ran.stderr)
        finally:
            released = cli("release", lease_id)
            assert released.returncode == 0, released.stderr

    @pytest.mark.parametrize("name", list(PULLED_IMAGES))
    def test_the_e2b_sdk(
        self, fleetside: Fleetside, references: dict[str, str], name: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`Sandbox.create(template=REF)`: the gateway leases from the pool whose template runs REF."""
        image = PULLED_IMAGES[name]
        _e2b_settings(monkeypatch, fleetside.url)
        sandbox = E2BSandbox.create(template=references[name], timeout=120)
        try:
            assert sandbox.get_info().template_id == references[name]
            if name == "distroless":
                # No shell at all: the SDK's `bash -l -c` (and the gateway's `sh` fallback) is
                # refused as not found, and nothing runs.
                with pytest.raises(Exception, match=r"(?i)not found") as refused:
                    sandbox.commands.run('echo "$PATH|$MARKER|$(pwd)"')
                assert "bash" in str(refused.value) or "sh" in str(refused.value), refused.value
            else:
                shown = sandbox.commands.run('echo "$PATH|$MARKER|$(pwd)"')
                assert shown.exit_code == 0, shown
                # The SDK's shell is a login shell: Debian's /etc/profile sets its own PATH (as on
                # E2B); musl's image has no /etc/profile, so its PATH is the image's.
                path, _, rest = shown.stdout.partition("|")
                assert rest == f"{image.marker}|{image.workdir}\n", shown
                assert path.startswith(image.path) if name == "bullseye" else path == image.path, shown
            # The files routes' root is the image's working directory.
            sandbox.files.write("e2b.txt", f"from the sdk, {name}\n")
            assert sandbox.files.read(f"{image.workdir}/e2b.txt") == f"from the sdk, {name}\n"
            listed = {entry.path for entry in sandbox.files.list(image.workdir)}
            assert f"{image.workdir}/e2b.txt" in listed, listed
        finally:
            sandbox.kill()

    def test_a_setuid_root_program_gives_a_command_no_root(
        self, fleetside: Fleetside, references: dict[str, str]
    ) -> None:
        """containerd unpacks the image's setuid bits (the local runtime clears them): the sandbox
        container's allowPrivilegeEscalation: false sets no_new_privs, so gVisor runs a setuid-root
        program (bullseye's BULLSEYE_SETUID_ID, GNU `id`) with the command's own uid."""
        image = PULLED_IMAGES["bullseye"]
        pod = fleetside.kube.json("get", "pods", "-l", f"{api.POOL_LABEL}={image.pool}")["items"][0]
        (container,) = pod["spec"]["containers"]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, container
        with (
            fleetside.fleet() as fleet,
            fleet.lease(image.pool, wait_seconds=120, ttl_seconds=120) as sandbox,
        ):
            shown = sandbox.exec([
                "bash", "-c",
                f"stat -c %A:%U {BULLSEYE_SETUID_ID}; id -u; {BULLSEYE_SETUID_ID} -u; {BULLSEYE_SETUID_ID}; "
                "grep NoNewPrivs /proc/self/status || echo no-NoNewPrivs-line",
            ])  # fmt: skip
            assert shown.exit_code == 0, shown
            mode, uid, euid, full, no_new_privs = shown.stdout.splitlines()
            # The bit is there, on a root-owned file: the program would run as root without NNP.
            assert mode == "-rwsr-xr-x:root", shown
            assert int(uid) != 0, shown
            assert euid == uid, f"a setuid-root program gave a command euid {euid}: {full}"
            assert "euid=" not in full, full  # GNU id names an euid only when it differs
            assert no_new_privs == "NoNewPrivs:\t1", shown


def _leftovers(real_cluster: RealCluster, namespace: str, pool: str) -> list[str]:
    """The pool's Pods still in the API, and containerd's containers still labelled with them."""
    pods = real_cluster.kubectl.json("get", "pods", "-n", namespace, "-l", f"{api.POOL_LABEL}={pool}")
    names = [p["metadata"]["name"] for p in pods["items"]]
    listed = real_cluster.ctr(
        "containers", "ls", "-q", f'labels."io.kubernetes.pod.namespace"=={namespace}'
    ).stdout.split()
    return names + [
        c for c in listed if real_cluster.ctr("containers", "info", c).stdout.count(f'"{pool}-') > 0
    ]


def test_a_pool_whose_image_cannot_be_pulled_says_so_and_leaves_nothing(
    fleetside: Fleetside, registry: LocalRegistry, real_cluster: RealCluster
) -> None:
    kube = fleetside.kube
    kube.apply(_pull_secret("wrong", registry.host, USER, "not-the-password"))
    image = f"{registry.host}/{PULLED_BUSYBOX}"
    kube.apply(
        _pool(image, api.AGENT_INJECTED, UNPULLABLE_POOL, pull_policy="Always", pull_secrets=("wrong",))
    )

    def degraded() -> dict[str, Any] | None:
        body = kube.json("get", "sandboxpool", UNPULLABLE_POOL)
        for condition in (body.get("status") or {}).get("conditions") or ():
            if condition["type"] == "Degraded" and condition["status"] == "True":
                return condition  # type: ignore[no-any-return]
        return None

    wait_until(lambda: degraded() is not None, timeout=120, what="the unpullable pool's Degraded condition")
    condition = degraded()
    assert condition is not None
    assert condition["reason"] == "ImagePullFailed", condition
    # The kubelet's words: the image and the registry's refusal.
    assert image in condition["message"], condition
    assert re.search(r"401|unauthorized", condition["message"], re.I), condition
    events = kube("get", "events", "--field-selector", f"involvedObject.name={UNPULLABLE_POOL}")
    assert "ImagePullFailed" in events, events
    # Backing off, not churning: one probe at a time at most.
    pods = kube.json("get", "pods", "-l", f"{api.POOL_LABEL}={UNPULLABLE_POOL}")["items"]
    assert len(pods) <= 1, [p["metadata"]["name"] for p in pods]
    kube("delete", "sandboxpool", UNPULLABLE_POOL, "--wait=true", timeout=120)
    namespace = fleetside.namespace
    wait_until(
        lambda: not _leftovers(real_cluster, namespace, UNPULLABLE_POOL),
        timeout=60,
        what="no Pod or container of the unpullable pool",
    )


def _seconds(status: dict[str, Any], state: str, key: str) -> float | None:
    stamp = ((status.get("state") or {}).get(state) or {}).get(key)
    return parse_time(stamp) if stamp else None


def _ready_after(
    kube: Kubectl, manifest: dict[str, Any], keep: bool = False, limit_s: int = 120
) -> tuple[float, float | None]:
    """Seconds from the create request until the Pod is Ready (kubectl's watch), and the copier's
    run by the kubelet's (one-second) timestamps; the Pod is gone before this returns unless `keep`."""
    name = manifest["metadata"]["name"]
    started = time.monotonic()
    kube.apply(manifest)
    kube("wait", "--for=condition=Ready", f"pod/{name}", f"--timeout={limit_s}s", timeout=limit_s + 30)
    seconds = time.monotonic() - started
    status = kube.json("get", "pod", name)["status"]
    copier = None
    for init in status.get("initContainerStatuses") or ():
        began, ended = _seconds(init, "terminated", "startedAt"), _seconds(init, "terminated", "finishedAt")
        copier = ended - began if began is not None and ended is not None else None
    if not keep:
        kube("delete", "pod", name, "--grace-period=1", "--wait=true", timeout=60)
    return seconds, copier


# The cold start's kinds: the sandbox image's own agent and the busybox image injected; with
# SANDFLEET_COLD_START_BUNDLE_BEFORE=REF (an agent bundle image imported into the node under REF, e.g.
# one built before a change to it), the busybox image injected from that one too, in the same run.
OWN = "own agent (sandfleet/sandbox)"
INJECTED = "injected (busybox)"
INJECTED_BEFORE = "injected (busybox), bundle image before"
BUNDLE_BEFORE = os.environ.get("SANDFLEET_COLD_START_BUNDLE_BEFORE")


def test_cold_start_of_an_injected_image_against_the_sandbox_images_own_agent(
    real_cluster: RealCluster, foreign_image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pods as the operator builds them (core/pods.py), one at a time, alternating, same run."""
    kinds = {
        OWN: _pool(real_cluster.sandbox_image, api.AGENT_IMAGE, "own"),
        INJECTED: _pool(foreign_image, api.AGENT_INJECTED, "injected"),
    }
    if BUNDLE_BEFORE:
        kinds[INJECTED_BEFORE] = _pool(foreign_image, api.AGENT_INJECTED, "before")
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    copies: dict[str, list[float]] = {kind: [] for kind in kinds}
    with real_cluster.namespace("cold") as kube:
        namespace = kube.namespace
        assert namespace is not None
        for round_ in range(COLD_STARTS):
            for kind, body in kinds.items():
                meta = {"namespace": namespace, "name": body["metadata"]["name"]}
                pool = pool_from_object({**body, "metadata": meta})
                name = f"{pool.name}-{round_}-{uuid.uuid4().hex[:4]}"
                manifest = sandbox_pod(
                    pool,
                    pool.template,
                    name=name,
                    region=REGION,
                    zone=None,
                    agent_key=b"k" * 32,
                    agent_bundle=AgentBundleImage(BUNDLE_BEFORE, "Never")
                    if kind == INJECTED_BEFORE and BUNDLE_BEFORE
                    else BUNDLE,
                )
                del manifest["metadata"]["ownerReferences"]  # no pool object: the Pod stands alone
                seconds, copier = _ready_after(kube, manifest)
                times[kind].append(seconds)
                if copier is not None:
                    copies[kind].append(copier)
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    own = medians[OWN]
    with capsys.disabled():
        for kind, values in times.items():
            print(
                f"\n[cold start, real node] {kind}: median {medians[kind]:.2f} s "
                f"({', '.join(f'{v:.2f}' for v in values)}); ratio to own agent {medians[kind] / own:.2f}"
            )
        for kind in (k for k in kinds if k != OWN):
            print(f"[cold start, real node] {kind}: the bundle copier ran (1 s stamps): {copies[kind]} s")
    # A measurement (docs/images.md, "Kubernetes"), not a gate: this only fails when injection is
    # broken or pathologically slow on this shared 2-core host.
    assert medians[INJECTED] < 30.0, times


def _forget(real_cluster: RealCluster, image: str) -> None:
    """Remove every name the node's containerd holds for `image`'s manifest (tag, digest, id): its
    blobs and snapshots go with them, so the next start pulls and unpacks it from nothing."""
    listed = real_cluster.ctr("images", "ls").stdout.splitlines()[1:]
    digest = next((line.split()[2] for line in listed if line.split()[0] == image), None)
    if digest is None:
        return
    names = [line.split()[0] for line in listed if line.split()[2] == digest]
    removed = real_cluster.ctr("images", "rm", "--sync", *names)
    assert removed.returncode == 0, removed.stderr


def _pull_seconds(kube: Kubectl, pod: str) -> float | None:
    """The kubelet's own account of the pull ("Successfully pulled image ... in 412ms ..."), if any."""
    events = kube("get", "events", "--field-selector", f"involvedObject.name={pod},reason=Pulled")
    match = re.search(r"Successfully pulled image \S+ in ([0-9.]+)(ms|s)", events)
    if match is None:
        return None
    return float(match.group(1)) / (1000 if match.group(2) == "ms" else 1)


def test_cold_start_with_a_pull_against_a_present_image_and_ctr_pull(
    real_cluster: RealCluster, registry: LocalRegistry, capsys: pytest.CaptureFixture[str]
) -> None:
    """The musl image (nothing of it on the node) from the registry, injected: created to Ready with
    the pull (image forgotten first) and without (present), and `ctr images pull` of it, alternating.
    With SANDFLEET_COLD_PULL_IMAGE=conda, the 1 GB conda image the same way."""
    image = f"{registry.host}/{PULLED_CONDA if COLD_PULL_CONDA else PULLED_MUSL}"
    body = _pool(
        image, api.AGENT_INJECTED, "coldpull", pull_policy="IfNotPresent", pull_secrets=(PULL_SECRET,)
    )
    times: dict[str, list[float]] = {"pull + start": [], "present": [], "ctr pull": [], "kubelet pull": []}
    with real_cluster.namespace("pull") as kube:
        namespace = kube.namespace
        assert namespace is not None
        kube.apply(_pull_secret(PULL_SECRET, registry.host, USER, PASSWORD))
        pool = pool_from_object({**body, "metadata": {"namespace": namespace, "name": "coldpull"}})
        for round_ in range(COLD_PULL_ROUNDS):
            for kind in ("pull + start", "present"):
                if kind == "pull + start":
                    _forget(real_cluster, image)
                name = f"coldpull-{round_}-{kind[:4].strip()}-{uuid.uuid4().hex[:4]}"
                manifest = sandbox_pod(
                    pool,
                    pool.template,
                    name=name,
                    region=REGION,
                    zone=None,
                    agent_key=b"k" * 32,
                    agent_bundle=BUNDLE,
                )
                del manifest["metadata"]["ownerReferences"]
                seconds, _ = _ready_after(kube, manifest, keep=True, limit_s=COLD_PULL_LIMIT_S)
                times[kind].append(seconds)
                pulled = _pull_seconds(kube, name)
                if kind == "pull + start":
                    assert pulled is not None, "the kubelet did not pull"
                    times["kubelet pull"].append(pulled)
                else:
                    assert pulled is None, "the kubelet pulled an image it had"
                kube("delete", "pod", name, "--grace-period=1", "--wait=true", timeout=60)
            _forget(real_cluster, image)
            started = time.monotonic()
            pulled_by_ctr = real_cluster.ctr(
                "images", "pull", "--hosts-dir", str(real_cluster.registry_hosts_dir),
                "--user", f"{USER}:{PASSWORD}", image, timeout=COLD_PULL_LIMIT_S,
            )  # fmt: skip
            times["ctr pull"].append(time.monotonic() - started)
            assert pulled_by_ctr.returncode == 0, pulled_by_ctr.stderr
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    with capsys.disabled():
        for kind, values in times.items():
            print(
                f"\n[cold pull, real node, {image.rsplit('/', 1)[-1]}] {kind}: median {medians[kind]:.2f} s "
                f"({', '.join(f'{v:.2f}' for v in values)})"
            )
    # A measurement (docs/images.md, "Kubernetes"), not a gate.
    assert medians["pull + start"] < COLD_PULL_LIMIT_S / 2, times
