"""A small synchronous Kubernetes API client (httpx + the admin client certificate) for the harness.

The fault harness's own eyes on the cluster (the truth recorder, the loopback kubelet): it must
survive an apiserver restart, so every watch here resumes or relists on its own.
"""

from __future__ import annotations

import json
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

WatchHandler = Callable[[str, dict[str, Any]], None]


class KubeApi:
    """Admin access to one local cluster, from its PKI directory."""

    def __init__(self, server: str, pki: Path) -> None:
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        self.server = server
        self.http = httpx.Client(base_url=server, verify=context, timeout=httpx.Timeout(10.0))
        self._context = context

    def close(self) -> None:
        self.http.close()

    def get(self, path: str, **params: str) -> dict[str, Any]:
        response = self.http.get(path, params=params)
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data

    def patch_status(self, namespace: str, pod: str, status: dict[str, Any]) -> bool:
        """Strategic-merge the Pod's status as a kubelet would; False when the Pod is gone."""
        response = self.http.patch(
            f"/api/v1/namespaces/{namespace}/pods/{pod}/status",
            content=json.dumps({"status": status}),
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )
        if response.status_code == 404:
            return False
        response.raise_for_status()
        return True

    def watch(self, path: str, handle: WatchHandler, stop: threading.Event, selector: str = "") -> None:
        """List `path` then follow its watch until `stop`; relist (a SYNC event first) when needed.

        `handle` sees ("SYNC", {}) before every (re)list, ADDED for what is listed, ("LISTED", {})
        after it, then the watch's events. Errors (the apiserver restarting) are retried every 0.2 s.
        """
        version: str | None = None
        while not stop.is_set():
            try:
                if version is None:
                    listed = self.get(path, labelSelector=selector)
                    handle("SYNC", {})
                    for item in listed.get("items") or []:
                        handle("ADDED", item)
                    handle("LISTED", {})
                    version = str(listed["metadata"]["resourceVersion"])
                version = self._follow(path, selector, version, handle, stop)
            except _Gone:
                version = None
            except Exception as error:  # the apiserver away or restarting: never let the watch die
                if not isinstance(error, httpx.HTTPError | OSError | ValueError):
                    print(f"watch on {path}: {error!r}; retrying", file=sys.stderr, flush=True)
                time.sleep(0.2)

    def _follow(
        self, path: str, selector: str, version: str, handle: WatchHandler, stop: threading.Event
    ) -> str:
        params = {
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "labelSelector": selector,
            "timeoutSeconds": "5",  # short, so a stopped recorder returns soon
        }
        timeout = httpx.Timeout(10.0, read=20.0)
        with self.http.stream("GET", path, params=params, timeout=timeout) as response:
            if response.status_code == 410:
                raise _Gone
            response.raise_for_status()
            for line in _lines(response.iter_lines(), stop):
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone
                    raise ValueError(obj.get("message", "watch error"))
                version = str(obj.get("metadata", {}).get("resourceVersion", version))
                if event.get("type") != "BOOKMARK":
                    handle(str(event["type"]), obj)
        return version


class _Gone(Exception):
    """The watch's resourceVersion is too old (an apiserver restart resets its cache): relist."""


def _lines(lines: Iterator[str], stop: threading.Event) -> Iterator[str]:
    for line in lines:
        if stop.is_set():
            return
        if line.strip():
            yield line
