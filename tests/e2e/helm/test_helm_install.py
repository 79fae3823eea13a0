"""`helm install` on a real gVisor node: pools fill, a lease runs commands, `helm test` passes, an
upgrade keeps leases, the NetworkPolicies hold, the unmodified `e2b` SDK drives a sandbox through
the gateway, the RL Deployments train, and `helm uninstall` leaves nothing behind.

The tests run in file order against one install (the last one uninstalls it).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import e2b
import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from localcluster.addresses import REAL_POD_CIDR
from sandfleet.client import Fleet, LeaseEnded, Sandbox
from sandfleet.core import api
from sandfleet.core.model import SandboxPod
from sandfleet.rl.catalogue_tasks import DEFAULT_CATALOGUE, apply_edit, image_name, load_tasks
from sandfleet.rl.catalogue_tasks import build_image as build_task_image
from tests.e2e.real_node.cluster import RealCluster, http_get_from_pod, pod_json
from tests.e2e.real_node.conftest import real_cluster  # noqa: F401  (the session fixture)
from tests.support import leases as recorded_leases
from tests.support.kube import Kubectl, wait_until
from tests.support.leases import recorded
from tests.unit.helm.chart import CHART, REPO, helm_binary

RELEASE = "sandfleet"
SANDBOXES = 2
SANDBOX_REF = "localhost/sandfleet/sandbox:0.1.0"
# The pool runs the default catalogue's task image: real PyPI packages with mined bugs, so evaluate
# runs their own tests.
TASKS_REF = "localhost/sandfleet/sandbox-tasks:0.1.0"
# A port a Pod of the namespace serves on that the sandboxes' egress allow-list opens.
ALLOWED_PORT = 9099
PSA_LABELS = (
    "pod-security.kubernetes.io/enforce=baseline",
    "pod-security.kubernetes.io/warn=restricted",
    "pod-security.kubernetes.io/audit=restricted",
)
# The agent's bounding set in gVisor: CHOWN, DAC_OVERRIDE, FOWNER, KILL, SETGID, SETUID (bits 0 1 3 5 6 7).
SANDBOX_CAPABILITY_MASK = (1 << 0) | (1 << 1) | (1 << 3) | (1 << 5) | (1 << 6) | (1 << 7)


@dataclass
class Install:
    """The chart installed on the real cluster, and how to drive it."""

    cluster: RealCluster
    namespace: str
    values: Path

    @property
    def kube(self) -> Kubectl:
        return self.cluster.kubectl.in_namespace(self.namespace)

    def helm(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(helm_binary()), "--namespace", self.namespace, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)},
            check=False,
        )

    def gateway_url(self) -> str:
        service = self.kube.json("get", "service", "sandfleet-gateway")
        return f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"

    def token(self, account: str = "sandfleet-test") -> str:
        # The gateway accepts only tokens minted for it (gateway.tokenAudiences: [sandfleet]).
        return self.kube("create", "token", account, "--audience", "sandfleet").strip()

    def fleet(self, account: str = "sandfleet-test") -> Fleet:
        return Fleet(url=self.gateway_url(), token=self.token(account), timeout=120)


def _json_line(argv: list[str]) -> dict[str, Any]:
    built = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False, timeout=3600)
    assert built.returncode == 0, f"{argv[0]} failed (its output is above)"
    result: dict[str, Any] = json.loads(built.stdout.strip().splitlines()[-1])
    return result


def _values(cluster: RealCluster, path: Path) -> Path:
    """The real node is one node in us-east1; the apiserver's address is the chart's own lookup."""
    values = {
        "runtimeClass": {"create": False, "name": cluster.runtime_class},
        "operator": {"resources": {"requests": {"cpu": "50m", "memory": "128Mi"}}},
        "gateway": {"resources": {"requests": {"cpu": "50m", "memory": "128Mi"}}},
        "pools": [
            {
                "name": "python",
                "image": TASKS_REF,
                "imagePullPolicy": "Never",
                "replicas": SANDBOXES,
                "regions": [{"name": "us-east1", "minWarm": 1}],
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
                "lease": {"defaultTTLSeconds": 600, "maxTTLSeconds": 3600},
            },
            {
                # Reuses a run's sandboxes: the agent resets its own Pod between episodes.
                "name": "recycled",
                "image": SANDBOX_REF,
                "imagePullPolicy": "Never",
                "replicas": 1,
                "regions": [{"name": "us-east1"}],
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
                "recycle": {"maxEpisodes": 3, "maxSeconds": 3600},
            },
        ],
        "networkPolicy": {
            "sandboxes": {"egress": [{"cidr": REAL_POD_CIDR, "ports": [{"port": ALLOWED_PORT}]}]},
        },
    }
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.fixture(scope="module")
def install(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:  # noqa: F811
    """Both images imported into the node's containerd, then `helm install --wait`."""
    product = _json_line([str(REPO / "hack" / "product-image"), "build", "--json"])
    real_cluster.import_image(Path(product["archive"]), product["ref"])
    sandbox = _json_line([str(REPO / "sandbox_image" / "build"), "--json"])
    real_cluster.import_image(Path(sandbox["archive"]), SANDBOX_REF)
    built = build_task_image(load_tasks(), image_name(DEFAULT_CATALOGUE))
    real_cluster.import_image(Path(built["archive"]), TASKS_REF)
    namespace = f"helm-{int(time.time())}"
    real_cluster.kubectl("create", "namespace", namespace)
    # Pod Security as the chart requires (and checks): sandboxes at baseline, the rest warned at restricted.
    real_cluster.kubectl("label", "namespace", namespace, *PSA_LABELS)
    installed = Install(
        real_cluster, namespace, _values(real_cluster, tmp_path_factory.mktemp("helm") / "v.yaml")
    )
    result = installed.helm(
        "install", RELEASE, str(CHART), "-f", str(installed.values), "--wait", "--timeout", "300s"
    )
    assert result.returncode == 0, f"{result.stderr}\n{installed.kube('get', 'pods', '-o', 'wide')}"
    yield installed
    installed.helm("uninstall", RELEASE, "--wait", "--timeout", "120s")
    real_cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def _ready_free(install: Install) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = install.kube.json("get", "pods", "-l", f"{api.POOL_LABEL}=python")["items"]
    ledgers = install.kube.json("get", api.LEDGER_PLURAL)["items"]
    warm = {name for name, sandbox in recorded(pods, ledgers).items() if sandbox.warm}
    return [p for p in pods if p["metadata"]["name"] in warm]


def test_pools_fill_with_gvisor_sandboxes(install: Install) -> None:
    wait_until(
        lambda: len(_ready_free(install)) == SANDBOXES, timeout=240, what=f"{SANDBOXES} warm sandboxes"
    )
    for pod in _ready_free(install):
        assert pod["spec"]["runtimeClassName"] == install.cluster.runtime_class
        assert pod["spec"]["nodeName"] == install.cluster.node_name
    status = install.kube.json("get", "sandboxpool", "python")["status"]
    wait_until(
        lambda: install.kube.json("get", "sandboxpool", "python")["status"].get("ready") == SANDBOXES,
        timeout=60,
        what=f"the pool's status to say {SANDBOXES} ready (was {status})",
    )


def test_lease_exec_evaluate_release_through_the_gateway(install: Install) -> None:
    task = load_tasks()[0]
    path = task.bug_path
    run = {"shell": task.workspace_test_command, "cwd": task.tree, "timeout_s": task.test_timeout_s}
    with install.fleet() as fleet, fleet.lease("python", labels={"run": "e2e"}) as sandbox:
        assert sandbox.exec(["python3", "-c", "print(6 * 7)"]).stdout.strip() == "42"
        assert "gVisor" in sandbox.exec(["dmesg"]).stdout
        # The package's own tests fail on the bug, and pass once the edit restores upstream's text.
        assert sandbox.evaluate(**run)["reward"] == 0.0
        broken = sandbox.read_file(path).decode()
        sandbox.write_file(path, apply_edit(broken, task.broken, task.original))
        assert sandbox.evaluate(**run)["reward"] == 1.0
        leased_pod = sandbox.lease.sandbox
    with install.fleet() as fleet:
        assert fleet.leases(run="e2e") == []
    # A released sandbox is never handed out again: its Pod goes, and the pool refills.
    wait_until(
        lambda: install.kube.run("get", "pod", leased_pod).returncode != 0,
        timeout=120,
        what=f"the released sandbox's Pod {leased_pod} to be deleted",
    )
    wait_until(lambda: len(_ready_free(install)) == SANDBOXES, timeout=240, what="the pool to refill")


def _pool_pods(install: Install, pool: str) -> dict[str, SandboxPod]:
    """The pool's live sandboxes, each with its lease state as the cluster records it (its ledger's)."""
    found = recorded_leases.read(install.kube, f"{api.POOL_LABEL}={pool}")
    return {name: sandbox for name, sandbox in found.items() if not sandbox.terminating}


def _pod_writes(install: Install) -> Counter[str]:
    """Writes the apiserver served on Pods ("POST pods", "PATCH pods", ...), by its own counters."""
    writes: Counter[str] = Counter()
    for family in text_string_to_metric_families(install.cluster.kubectl("get", "--raw", "/metrics")):
        for sample in family.samples:
            labels = sample.labels
            if sample.name != "apiserver_request_total" or labels.get("resource") != "pods":
                continue
            if labels.get("verb") in ("POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"):
                resource = "/".join(filter(None, ("pods", labels.get("subresource"))))
                writes[f"{labels['verb']} {resource}"] += int(sample.value)
    return writes


def _state(sandbox: SandboxPod) -> str:
    return sandbox.state


def test_a_recycling_pool_gives_its_run_the_reset_pod_back_and_makes_no_pod_per_episode(
    install: Install,
) -> None:
    """On the real node: release resets the Pod in place (files, processes gone), its run's next lease
    gets it back under a new lease id, the ended lease reaches nothing, and no Pod comes or goes."""
    wait_until(
        lambda: any(_state(p) == api.LEASE_FREE for p in _pool_pods(install, "recycled").values()),
        timeout=240,
        what="a warm sandbox in the recycling pool",
    )
    with install.fleet() as fleet:
        with fleet.lease("recycled", labels={"run": "reuse"}) as first:
            first.exec(["sh", "-c", "echo episode-1 > /workspace/marker; echo x > /tmp/left"])
            first.exec(["sh", "-c", "nohup sleep 1000 > /dev/null 2>&1 &"])
            pod, ended = first.lease.sandbox, first.lease.id
        reserved = _pool_pods(install, "recycled")[pod]
        assert (_state(reserved), reserved.episodes) == (api.LEASE_RESERVED, 1), reserved
        wait_until(
            lambda: any(_state(p) == api.LEASE_FREE for p in _pool_pods(install, "recycled").values()),
            timeout=240,
            what="the pool's warm sandbox beside the reserved one",
        )
        before = set(_pool_pods(install, "recycled"))
        writes_before = _pod_writes(install)
        with fleet.lease("recycled", labels={"run": "reuse"}) as second:
            assert second.lease.sandbox == pod  # the reset Pod, not the warm one
            assert second.lease.id == f"{ended}~1"
            listing = second.exec(["sh", "-c", "ls -a /workspace /tmp; ps -eo args"]).stdout
            assert "marker" not in listing, listing
            assert "left" not in listing, listing
            assert "sleep 1000" not in listing, listing
            # The ended episode's lease reaches nothing, though its Pod serves the next one.
            with pytest.raises(LeaseEnded):
                first.exec(["true"])
        # The whole episode, lease to reset, by the apiserver's own counters: no Pod made or deleted.
        episode = _pod_writes(install) - writes_before
        print(f"apiserver writes on Pods for one recycled episode: {dict(episode)}")
        assert not episode["POST pods"], episode
        assert not episode["DELETE pods"], episode
        assert not episode["POST pods/binding"], episode
        assert not episode["PATCH pods"], episode  # the leases and the reset are the ledger's
        # Another run never gets it: a pool's reserved Pods are their run's alone.
        with fleet.lease("recycled", labels={"run": "other"}) as other:
            assert other.lease.sandbox != pod
        assert pod in before
        assert pod in _pool_pods(install, "recycled")
    # The run's second episode made and deleted no Pod (the other run's lease may refill the pool).
    assert before <= set(_pool_pods(install, "recycled")) | {other.lease.sandbox}


def test_sandboxes_run_with_six_capabilities_and_no_new_privileges(install: Install) -> None:
    """On the real node, under gVisor: what the Pod's securityContext asks for is what the agent has."""
    with install.fleet() as fleet, fleet.lease("python", labels={"run": "caps"}) as sandbox:
        status = sandbox.exec(["cat", "/proc/1/status"]).stdout
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        assert int(fields["CapBnd"].strip(), 16) == SANDBOX_CAPABILITY_MASK, status
        assert int(fields["CapEff"].strip(), 16) & ~SANDBOX_CAPABILITY_MASK == 0, status
        assert fields["NoNewPrivs"].strip() == "1", status
        assert "gVisor" in sandbox.exec(["dmesg"]).stdout
    pod = _ready_free(install)[0]
    assert pod["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] == "2Gi"
    namespace = install.cluster.kubectl.json("get", "namespace", install.namespace)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"


def test_a_pool_without_gvisor_is_refused_by_the_apiserver(install: Install) -> None:
    pool = install.kube.json("get", "sandboxpool", "python")
    escape = {
        "apiVersion": pool["apiVersion"],
        "kind": "SandboxPool",
        "metadata": {"name": "escape"},
        "spec": {**pool["spec"], "template": {**pool["spec"]["template"], "runtimeClassName": "runc"}},
    }
    result = install.kube.run("create", "-f", "-", stdin=json.dumps(escape))
    assert result.returncode != 0, "the apiserver accepted a pool with runtimeClassName runc"
    assert "runtimeClassName runc is not allowed" in result.stderr, result.stderr
    assert install.kube.run("get", "sandboxpool", "escape").returncode != 0


def test_helm_test_leases_execs_and_releases(install: Install) -> None:
    result = install.helm("test", RELEASE, "--timeout", "300s")
    assert result.returncode == 0, result.stdout + result.stderr
    # The hook's output-log policy prints the Pod's log; the passed Pod is deleted at once.
    assert "sandfleet-helm-test-ok" in result.stdout + result.stderr
    assert "Succeeded" in result.stdout
    assert install.kube.run("get", "pod", "sandfleet-test-lease").returncode != 0


def _gateway_pods(install: Install) -> set[str]:
    pods = install.kube.json("get", "pods", "-l", "app.kubernetes.io/component=gateway")["items"]
    return {p["metadata"]["name"] for p in pods}


def test_upgrade_keeps_leases(install: Install) -> None:
    with install.fleet() as fleet:
        (lease,) = fleet.acquire("python", labels={"run": "upgrade"})
        before = _gateway_pods(install)
        result = install.helm(
            "upgrade", RELEASE, str(CHART), "-f", str(install.values), "--set", "gateway.maxWaiting=77",
            "--wait", "--timeout", "300s",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        wait_until(
            lambda: not before & _gateway_pods(install), timeout=120, what="the old gateway Pods to go"
        )
    # New gateway Pods, same lease: it lives on the sandbox Pod, not in a gateway.
    with install.fleet() as fleet:
        assert [item.id for item in fleet.leases(run="upgrade")] == [lease.id]
        assert Sandbox(fleet, lease).exec(["echo", "still-mine"]).stdout.strip() == "still-mine"
        assert fleet.release(lease.id) is True


def test_sandboxes_reach_nothing_and_only_the_gateway_reaches_them(install: Install) -> None:
    kube = install.kube
    stranger = install.cluster.pod("stranger", gvisor=False, labels={"app": "stranger"})
    kube.apply(stranger)
    kube("wait", "--for=condition=Ready", "pod/stranger", "--timeout=120s", timeout=150)
    serve = f"nohup python3 -m http.server {ALLOWED_PORT} >/dev/null 2>&1 &"
    kube("exec", "stranger", "--", "sh", "-c", serve)
    wait_until(lambda: len(_ready_free(install)) >= 1, timeout=180, what="a warm sandbox")
    target = _ready_free(install)[0]
    url = f"http://{target['status']['podIP']}:{8000}/v1/ready"
    # Another Pod of the namespace is no gateway: the agent port is closed to it.
    assert http_get_from_pod(kube, "stranger", url, timeout_s=2).startswith("FAIL")
    # Nor is it a gateway client until it is labelled as one (networkPolicy.gatewayFrom's default).
    gateway = f"{install.gateway_url()}/healthz"
    assert http_get_from_pod(kube, "stranger", gateway, timeout_s=2).startswith("FAIL")
    kube("label", "pod", "stranger", "sandfleet.dev/client=true")
    wait_until(
        lambda: http_get_from_pod(kube, "stranger", gateway, timeout_s=2).startswith("200"),
        timeout=30,
        what="a Pod labelled sandfleet.dev/client=true to reach the gateway",
    )
    stranger_ip = pod_json(kube, "stranger")["status"]["podIP"]
    with install.fleet() as fleet, fleet.lease("python") as sandbox:
        probe = (
            "import sys, urllib.request\n"
            "try:\n"
            "    urllib.request.urlopen(sys.argv[1], timeout=2); print('REACHED')\n"
            "except Exception as e:\n"
            "    print('BLOCKED', e)\n"
        )
        targets = (
            "https://10.96.0.1:443/version",
            f"{install.gateway_url()}/healthz",
            f"http://{stranger_ip}:8000/",
        )
        for where in targets:
            answer = sandbox.exec(["python3", "-c", probe, where], timeout_s=20).stdout.strip()
            assert answer.startswith("BLOCKED"), f"a sandbox reached {where}: {answer}"
        # What the allow-list opens (the pod range on one port) is reachable; nothing else there is.
        allowed = f"http://{stranger_ip}:{ALLOWED_PORT}/"
        answer = sandbox.exec(["python3", "-c", probe, allowed], timeout_s=20).stdout.strip()
        assert answer == "REACHED", f"the allow-listed {allowed} was not reachable: {answer}"
    kube("delete", "pod", "stranger", "--wait=false")


def test_the_unmodified_e2b_sdk_drives_a_sandbox_through_the_charts_gateway(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK's own settings only; its key is a ServiceAccount token minted for the gateway.
    gateway = install.gateway_url()
    for name in ("E2B_DEBUG", "E2B_DOMAIN", "E2B_ACCESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("E2B_API_URL", f"{gateway}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{gateway}/e2b/envd")
    monkeypatch.setenv("E2B_API_KEY", install.token())
    episode = f"e2b-{int(time.time())}"
    sandbox = e2b.Sandbox.create(template="python", timeout=120, metadata={"episode": episode})
    try:
        with install.fleet() as fleet:  # a sandbox is a lease of the pool, labelled with the metadata
            (held,) = [lease for lease in fleet.leases(pool="python") if lease.id == sandbox.sandbox_id]
        assert held.labels["episode"] == episode
        found = e2b.Sandbox.list(query=e2b.SandboxQuery(metadata={"episode": episode})).next_items()
        assert [listed.sandbox_id for listed in found] == [sandbox.sandbox_id]

        assert sandbox.commands.run("python3 -c 'print(6 * 7)'").stdout == "42\n"
        assert "gVisor" in sandbox.commands.run("dmesg").stdout
        with pytest.raises(e2b.CommandExitException) as failed:
            sandbox.commands.run("echo partial; exit 3")
        assert (failed.value.exit_code, failed.value.stdout) == (3, "partial\n")
        seen: list[tuple[float, str]] = []
        lines, pause = 3, 1.0
        streamed = sandbox.commands.run(
            f"for i in $(seq {lines}); do echo line-$i; sleep {pause}; done",
            on_stdout=lambda chunk: seen.append((time.monotonic(), chunk)),
        )
        done = time.monotonic()
        assert streamed.stdout.splitlines() == [f"line-{i}" for i in range(1, lines + 1)]
        assert "".join(chunk for _, chunk in seen) == streamed.stdout
        assert done - seen[0][0] > (lines - 1) * pause * 0.8  # the first line came while it ran

        text = f"written at {time.time()}\n"
        sandbox.files.write("e2b/notes.txt", text)
        assert sandbox.files.read("e2b/notes.txt") == text
        assert sandbox.commands.run("cat e2b/notes.txt").stdout == text
        # A file-like body streams through the gateway as an upload, past the control bodies' 1 MiB.
        big = os.urandom(3 << 20)
        sandbox.files.write("e2b/big.bin", io.BytesIO(big))
        assert bytes(sandbox.files.read("e2b/big.bin", format="bytes")) == big
        listed = {entry.name: entry for entry in sandbox.files.list("e2b")}
        assert set(listed) == {"notes.txt", "big.bin"}
        assert listed["big.bin"].size == len(big)

        sandbox.set_timeout(300)  # the lease's TTL, from now
        left = (sandbox.get_info().end_at - datetime.now(UTC)).total_seconds()
        assert 300 - 30 < left <= 300
    finally:
        sandbox.kill()
    assert e2b.Sandbox.kill(sandbox.sandbox_id) is False  # released: gone for the SDK
    with install.fleet() as fleet:
        assert sandbox.sandbox_id not in {lease.id for lease in fleet.leases(pool="python")}


def _learner_stats(install: Install) -> dict[str, Any]:
    """The learner's /v1/stats, read from inside its Pod (its Service admits only the actors)."""
    read = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8500/v1/stats').read().decode())"
    out = install.kube("exec", "deploy/sandfleet-learner", "--", "python3", "-c", read)
    stats: dict[str, Any] = json.loads(out)
    return stats


def test_the_rl_deployments_train_from_pods(install: Install) -> None:
    # The chart's defaults with only what a node without GPUs and with 2 cores needs changed: the
    # chart adds the tasks' pool, the actors lease from it and reach the learner by its Service.
    run = f"pods-{int(time.time())}"
    small = {"requests": {"cpu": "50m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
    rl = {
        "enabled": True,
        "run": run,
        "tasksPool": {
            "name": "rl-tasks", "image": TASKS_REF, "imagePullPolicy": "Never", "replicas": 2,
            "regions": [{"name": "us-east1", "minWarm": 1}],
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
        },
        "learner": {"gpus": 0, "device": "numpy", "resources": small, "args": ["--batch-size=2"]},
        "actor": {"gpus": 0, "replicas": 1, "resources": small, "args": ["--concurrency=2"]},
    }  # fmt: skip
    values = install.values.with_name("rl.yaml")
    values.write_text(yaml.safe_dump({"rl": rl}))
    result = install.helm(
        "upgrade", RELEASE, str(CHART), "-f", str(install.values), "-f", str(values),
        "--wait", "--timeout", "300s",
    )  # fmt: skip
    assert result.returncode == 0, f"{result.stderr}\n{install.kube('get', 'pods', '-o', 'wide')}"
    pool = install.kube.json("get", "sandboxpool", "rl-tasks")
    assert pool["spec"]["template"]["image"] == TASKS_REF

    def trained() -> bool:
        stats = _learner_stats(install)
        return int(stats["received"]) >= 4 and int(stats["version"]) >= 2

    wait_until(trained, timeout=300, what="episodes from the actor Pod to reach the learner Pod", interval=5)
    stats = _learner_stats(install)
    assert stats["run"] == run
    assert any(name.startswith("sandfleet-actor-") for name in stats["by_actor"]), stats["by_actor"]
    # The run is the RL ServiceAccount's (runs are first come, first served): read it as that caller.
    with install.fleet("sandfleet-rl") as fleet:
        assert fleet.policy(run)["version"] >= 2  # the learner published through the gateway
    # The learner's spans went through whichever gateway replica its connection reached, the actors'
    # through others: the profile read from each replica, directly at its Pod, has them all.
    token = install.token("sandfleet-rl")
    replicas = [
        pod["status"]["podIP"]
        for pod in install.kube.json("get", "pods", "-l", "app.kubernetes.io/component=gateway")["items"]
        if pod["status"].get("podIP") and not pod["metadata"].get("deletionTimestamp")
    ]
    assert len(replicas) >= 2, "the chart's default of two gateway replicas is the case here"
    auth = {"Authorization": f"Bearer {token}"}
    wanted = {"sandbox_wait", "generate", "score", "train", "weight_sync"}
    held: dict[str, list[str]] = {}
    profiles: dict[str, dict[str, Any]] = {}

    def every_replica_has_the_whole_run() -> bool:
        # The actor keeps playing: a replica's share that is not there yet (its spans went to a
        # replica restarted since, or a listing of the replicas a moment old) comes with the next
        # episodes. What must hold is that each replica, asked directly, gathers every phase.
        for ip in replicas:
            with httpx.Client(base_url=f"http://{ip}:8080", headers=auth, trust_env=False) as direct:
                answer = direct.get(f"/v1/runs/{run}/profile", params={"window_seconds": 600})
                assert answer.status_code == 200, answer.text
                own = direct.get(f"/v1/runs/{run}/spans", params={"window_seconds": 600}).json()["spans"]
            profiles[ip] = answer.json()
            held[ip] = sorted({span["phase"] for span in own})
        return all(
            wanted <= {p["phase"] for p in profile["phases"]}
            and not [note for note in profile["notes"] if "did not answer" in note]
            for profile in profiles.values()
        )

    try:
        wait_until(every_replica_has_the_whole_run, timeout=60, what="each replica to gather every phase")
    except AssertionError as error:
        gateways = install.kube("get", "pods", "-l", "app.kubernetes.io/component=gateway", "-o", "wide")
        summary = {ip: ([p["phase"] for p in f["phases"]], f["notes"]) for ip, f in profiles.items()}
        raise AssertionError(f"{error}\nprofiles: {summary}\nheld by each: {held}\n{gateways}") from None
    assert all(profile["learner_busy"] is not None for profile in profiles.values()), profiles
    assert any("train" in phases for phases in held.values()), held
    print(f"phases each replica holds itself: {held}")  # how the reports were spread, for the log
    # Deterministically: a span reported to one replica only is in the profile read at the other.
    probe, (first, second) = f"{run}-probe", replicas[:2]
    now = time.time()
    span = {"phase": "train", "start": now - 2, "end": now - 1, "source": "learner", "worker": "probe"}
    reported = httpx.post(
        f"http://{first}:8080/v1/runs/{probe}/spans", json={"spans": [span]}, headers=auth, trust_env=False
    )
    assert reported.status_code == 200, reported.text
    at_second = f"http://{second}:8080/v1/runs/{probe}"
    assert httpx.get(f"{at_second}/spans", headers=auth, trust_env=False).json()["spans"] == []
    gathered = httpx.get(f"{at_second}/profile", headers=auth, trust_env=False).json()
    assert [(p["phase"], p["count"]) for p in gathered["phases"]] == [("train", 1)], gathered
    assert not [note for note in gathered["notes"] if "did not answer" in note], gathered["notes"]
    stranger = httpx.get(f"{at_second}/profile", headers={"Authorization": f"Bearer {install.token()}"})
    assert stranger.status_code == 403, stranger.text  # another tenant: nothing, from either replica
    result = install.helm(
        "upgrade", RELEASE, str(CHART), "-f", str(install.values), "--wait", "--timeout", "300s"
    )
    assert result.returncode == 0, result.stderr


def test_uninstall_leaves_nothing_but_the_crds(install: Install) -> None:
    result = install.helm("uninstall", RELEASE, "--wait", "--timeout", "120s")
    assert result.returncode == 0, result.stderr

    def leftovers() -> list[str]:
        kinds = "all,sandboxpools,serviceaccounts,roles,rolebindings,networkpolicies,configmaps"
        names = install.kube("get", kinds, "-o", "name").split()
        # The namespace's own defaults, and what the gateway makes at run time (policy ConfigMaps).
        ignored = ("serviceaccount/default", "configmap/kube-root-ca.crt", "configmap/sandfleet-run-")
        names = [n for n in names if not n.startswith(ignored) and "stranger" not in n]
        cluster = install.cluster.kubectl("get", "clusterroles,clusterrolebindings", "-o", "name").split()
        return names + [n for n in cluster if install.namespace in n]

    deadline = time.monotonic() + 180
    while (left := leftovers()) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, f"still there 180 s after helm uninstall: {left}"
    crds = install.cluster.kubectl("get", "crd", "-o", "name")
    assert "sandboxpools.sandfleet.dev" in crds
