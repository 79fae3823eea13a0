"""A kubelet that only reports readiness: sandbox Pods marked Ready once kwok runs them, no agent behind.

For faults on the lease path at a scale (a pool of 1,000) where one real agent process per Pod
(kubelet.py) does not fit on a small machine. Nothing may reach these sandboxes' data plane: a
test that uses it only leases, renews and releases.
"""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import httpx

from sandfleet.core import api
from tests.integration.faults.kubeapi import KubeApi


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ReadinessKubelet:
    """Follows one namespace's sandbox Pods and reports each Running one Ready, once."""

    def __init__(self, kube: KubeApi, namespace: str, workers: int = 4) -> None:
        self.kube = kube
        self.namespace = namespace
        self.reported = 0
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ready-kubelet")
        self._thread = threading.Thread(target=self._watch, name="ready-kubelet-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _watch(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        self.kube.watch(path, self._on_event, self._stop, selector=api.POOL_LABEL)

    def _on_event(self, kind: str, pod: dict[str, Any]) -> None:
        if kind in ("SYNC", "LISTED", "DELETED"):
            return
        metadata = pod.get("metadata") or {}
        status = pod.get("status") or {}
        if metadata.get("deletionTimestamp") or status.get("phase") != "Running" or not status.get("podIP"):
            return
        conditions = status.get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            return
        uid = str(metadata.get("uid", ""))
        with self._lock:
            if uid in self._seen:
                return
            self._seen.add(uid)
        self._pool.submit(self._report, pod)

    def _report(self, pod: dict[str, Any]) -> None:
        name = str(pod["metadata"]["name"])
        container = pod["spec"]["containers"][0]
        status = {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": _now()},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": _now()},
            ],
            "containerStatuses": [
                {
                    "name": container.get("name", api.SANDBOX_CONTAINER),
                    "image": container.get("image", ""),
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": _now()}},
                }
            ],
        }
        try:
            if self.kube.patch_status(self.namespace, name, status):
                with self._lock:
                    self.reported += 1
        except httpx.HTTPError as error:
            # Reported again on the Pod's next event; a harness error must show, not vanish.
            print(f"readiness kubelet: {name}: {error!r}", file=sys.stderr, flush=True)
            with self._lock:
                self._seen.discard(str(pod["metadata"]["uid"]))
