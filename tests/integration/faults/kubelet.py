"""A loopback kubelet: a real sandbox agent process per sandbox Pod, on the Pod's own loopback address.

The fault cluster's kwok hands Pods addresses from 127.1.0.0/16 and leaves them Running but not
Ready (see conftest.py); this kubelet starts `sandfleet_agent` bound to the Pod's address, marks the
Pod Ready once the agent's exec path answers (as a readiness probe would), marks it Failed when the
agent dies (restartPolicy Never), and stops the agent when the Pod goes. Killing an agent, or every
agent on a node, is how faults take sandboxes away for real; each such loss is recorded here, by
the host, with its time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from sandfleet.core import api
from tests.integration.faults.kubeapi import KubeApi
from tests.support.invariants import Loss

LOOPBACK_PREFIX = "127.1."


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Agent:
    """One agent process serving one Pod."""

    uid: str
    pod: str
    node: str
    ip: str
    port: int
    process: subprocess.Popen[bytes]
    root: Path
    stopping: bool = False
    ready: bool = False
    reported: bool = False  # its Ready status reached the apiserver


class LoopbackKubelet:
    """Runs and watches the agents of one namespace's sandbox Pods."""

    def __init__(self, kube: KubeApi, namespace: str, workdir: Path) -> None:
        self.kube = kube
        self.namespace = namespace
        self.workdir = workdir
        self.losses: list[Loss] = []
        self.lost_nodes: set[str] = set()
        self.started = 0
        self._agents: dict[str, Agent] = {}
        self._starting: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="kubelet-start")
        self._threads = [
            threading.Thread(target=self._watch, name="kubelet-watch", daemon=True),
            threading.Thread(target=self._monitor, name="kubelet-monitor", daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            agents = list(self._agents.values())
        for agent in agents:
            self._kill(agent)

    # -- what faults do --------------------------------------------------------------------------

    def agent_pods(self) -> dict[str, str]:
        """Pod name -> node, for every Pod whose agent runs."""
        with self._lock:
            return {a.pod: a.node for a in self._agents.values() if not a.stopping}

    def kill_agent(self, pod: str) -> Loss:
        """SIGKILL the agent of `pod` (a crash inside the sandbox); the kubelet then fails the Pod."""
        with self._lock:
            agent = next(a for a in self._agents.values() if a.pod == pod and not a.stopping)
            loss = Loss(pod, time.time(), "agent killed")
            self.losses.append(loss)
        _signal(agent.process, signal.SIGKILL)
        return loss

    def lose_node(self, node: str) -> list[Loss]:
        """The machine behind `node` is gone: every agent on it dies, and nobody reports it."""
        with self._lock:
            self.lost_nodes.add(node)
            victims = [a for a in self._agents.values() if a.node == node and not a.stopping]
            at = time.time()
            losses = [Loss(a.pod, at, f"node {node} deleted") for a in victims]
            self.losses.extend(losses)
            for agent in victims:
                agent.stopping = True
        for agent in victims:
            self._kill(agent)
        return losses

    def restore_node(self, node: str) -> None:
        with self._lock:
            self.lost_nodes.discard(node)

    # -- the watch -------------------------------------------------------------------------------

    def _watch(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        self.kube.watch(path, self._on_event, self._stop, selector=api.POOL_LABEL)

    def _on_event(self, kind: str, pod: dict[str, Any]) -> None:
        if kind in ("SYNC", "LISTED"):
            return
        metadata = pod.get("metadata") or {}
        uid = str(metadata.get("uid", ""))
        if kind == "DELETED" or metadata.get("deletionTimestamp"):
            self._stop_agent(uid)
            return
        status = pod.get("status") or {}
        ip = str(status.get("podIP") or "")
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        if status.get("phase") != "Running" or not ip.startswith(LOOPBACK_PREFIX):
            return
        with self._lock:
            if uid in self._agents or uid in self._starting or node in self.lost_nodes:
                return
            self._starting.add(uid)
        self._pool.submit(self._start_agent_logged, pod)

    def _start_agent_logged(self, pod: dict[str, Any]) -> None:
        try:
            self._start_agent(pod)
        except Exception as error:  # a harness bug must show, not vanish in the thread pool
            print(
                f"loopback kubelet: starting {pod['metadata']['name']}: {error!r}",
                file=sys.stderr,
                flush=True,
            )

    def _start_agent(self, pod: dict[str, Any]) -> None:
        metadata = pod["metadata"]
        uid, name = str(metadata["uid"]), str(metadata["name"])
        ip = str(pod["status"]["podIP"])
        container = pod["spec"]["containers"][0]
        port = int(container["ports"][0]["containerPort"])
        try:
            # kwok reuses a deleted Pod's address: whatever agent still holds it belongs to a gone Pod.
            with self._lock:
                stale = [a for a in self._agents.values() if a.ip == ip and a.uid != uid]
            for agent in stale:
                self._stop_agent(agent.uid)
            root = self.workdir / uid
            (root / "workspace").mkdir(parents=True, exist_ok=True)
            with (root / "agent.log").open("wb") as log:
                process = subprocess.Popen(
                    [sys.executable, "-m", "sandfleet_agent", "--host", ip, "--port", str(port),
                     "--root", str(root / "workspace"), "--logs-dir", str(root / "logs"),
                     "--insecure-no-token"],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
            agent = Agent(uid, name, str(pod["spec"].get("nodeName", "")), ip, port, process, root)
            with self._lock:
                self._agents[uid] = agent
                self.started += 1
            if self._wait_ready(agent):
                agent.reported = self._report(agent, container, ready=True)
            elif not agent.stopping and agent.process.poll() is None:
                print(f"loopback kubelet: {name}'s agent never answered; starting it again", file=sys.stderr)
                self._stop_agent(uid)  # the next resync starts a fresh one
        finally:
            with self._lock:
                self._starting.discard(uid)

    def _wait_ready(self, agent: Agent) -> bool:
        deadline = time.monotonic() + 15
        with httpx.Client(timeout=1.0) as client:
            while time.monotonic() < deadline and not agent.stopping and agent.process.poll() is None:
                try:
                    if client.get(f"http://{agent.ip}:{agent.port}/v1/ready").status_code == 200:
                        agent.ready = True
                        return True
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        return False

    def _report(self, agent: Agent, container: dict[str, Any], ready: bool) -> bool:
        """Write the Pod's status as a kubelet would: Ready, or Failed with the agent's exit."""
        if ready:
            state: dict[str, Any] = {"running": {"startedAt": _now()}}
            status: dict[str, Any] = {"phase": "Running"}
        else:
            code = agent.process.returncode
            state = {
                "terminated": {
                    "exitCode": 128 - code if code is not None and code < 0 else code or 1,
                    "reason": "Error",
                    "startedAt": _now(),
                    "finishedAt": _now(),
                }
            }
            status = {"phase": "Failed"}
        flag = "True" if ready else "False"
        status["conditions"] = [
            {"type": "Ready", "status": flag, "lastTransitionTime": _now()},
            {"type": "ContainersReady", "status": flag, "lastTransitionTime": _now()},
        ]
        status["containerStatuses"] = [
            {
                "name": container.get("name", api.SANDBOX_CONTAINER),
                "image": container.get("image", ""),
                "imageID": "",
                "ready": ready,
                "started": ready,
                "restartCount": 0,
                "state": state,
            }
        ]
        try:
            self.kube.patch_status(self.namespace, agent.pod, status)
        except httpx.HTTPError:
            return False  # the apiserver is away: _monitor reports again, as a kubelet's sync would
        return True

    # -- deaths and stops ------------------------------------------------------------------------

    def _resync(self) -> None:
        """Go over every Pod again, as a kubelet's periodic sync does: a missed event is no lost Pod."""
        try:
            listed = self.kube.get(f"/api/v1/namespaces/{self.namespace}/pods", labelSelector=api.POOL_LABEL)
        except httpx.HTTPError:
            return
        for pod in listed.get("items") or []:
            self._on_event("ADDED", pod)
            conditions = (pod.get("status") or {}).get("conditions") or []
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
            with self._lock:
                agent = self._agents.get(str(pod["metadata"]["uid"]))
            if agent is not None and agent.ready and not ready and agent.process.poll() is None:
                agent.reported = False

    def _monitor(self) -> None:
        reported: set[str] = set()
        rounds = 0
        while not self._stop.wait(0.2):
            rounds += 1
            if rounds % 10 == 0:
                self._resync()
            with self._lock:
                dead = [
                    a
                    for a in self._agents.values()
                    if a.process.poll() is not None
                    and not a.stopping
                    and a.uid not in reported
                    and a.node not in self.lost_nodes
                ]
                unreported = [
                    a
                    for a in self._agents.values()
                    if a.ready and not a.reported and not a.stopping and a.process.poll() is None
                ]
            for agent, ready in [*((a, False) for a in dead), *((a, True) for a in unreported)]:
                try:
                    pod = self.kube.get(f"/api/v1/namespaces/{self.namespace}/pods/{agent.pod}")
                    container = pod["spec"]["containers"][0]
                except (httpx.HTTPError, KeyError):
                    continue  # gone, or the apiserver is away: try again on the next round
                if self._report(agent, container, ready=ready):
                    if ready:
                        agent.reported = True
                    else:
                        reported.add(agent.uid)

    def _stop_agent(self, uid: str) -> None:
        with self._lock:
            agent = self._agents.pop(uid, None)
            if agent is not None:
                agent.stopping = True
        if agent is not None:
            self._kill(agent)
            shutil.rmtree(agent.root, ignore_errors=True)

    @staticmethod
    def _kill(agent: Agent) -> None:
        _signal(agent.process, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.process.wait(timeout=10)


def _signal(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
