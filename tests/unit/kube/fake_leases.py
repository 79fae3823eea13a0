"""One namespace's coordination.k8s.io Leases, as an apiserver keeps them, behind KubeClient's calls.

Writes bump a resourceVersion; a PUT on an older one is a 409, as is a POST of a name that exists; a
PATCH is a JSON merge patch; a watch stays open and says nothing. Every body crosses as JSON, so what
a test reads is what the wire carried.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from sandfleet.kube.errors import KubeError
from sandfleet.kube.heartbeat import LEASES

NAMESPACE = "sandfleet-system"
PATH = LEASES.format(namespace=NAMESPACE)


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    merged = dict(target)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class FakeLeases:
    """The Leases of NAMESPACE; `calls` records each (method, name), `failing` fails every call."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.calls: list[tuple[str, str]] = []
        self.failing: Exception | None = None

    def holder(self, name: str) -> str:
        return str(self.objects[name]["spec"].get("holderIdentity") or "")

    def put_lease(self, name: str, spec: dict[str, Any], labels: dict[str, str] | None = None) -> None:
        """A Lease written by someone else (another replica, another version)."""
        metadata: dict[str, Any] = {"name": name, **({"labels": labels} if labels else {})}
        self._store(
            {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}
        )

    async def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        assert path == PATH or path.startswith(f"{PATH}/"), path
        name = path[len(PATH) + 1 :]
        self.calls.append((method, name))
        await asyncio.sleep(0)
        if self.failing is not None:
            raise self.failing
        body = json.loads(json.dumps(kwargs.get("body")))
        if method == "GET" and not name:
            selector = (kwargs.get("query") or {}).get("labelSelector")
            items = [
                o
                for o in self.objects.values()
                if not selector or selector in o["metadata"].get("labels", {})
            ]
            return self._copy({"items": items, "metadata": {"resourceVersion": str(self.version)}})
        if method == "POST":
            if body["metadata"]["name"] in self.objects:
                raise KubeError(409, "already exists")
            return self._store(body)
        if name not in self.objects:
            raise KubeError(404, f'leases "{name}" not found')
        stored = self.objects[name]
        if method == "GET":
            return self._copy(stored)
        if method == "PUT":
            if body["metadata"].get("resourceVersion") != stored["metadata"]["resourceVersion"]:
                raise KubeError(409, "the object has been modified")
            return self._store(body)
        if method == "PATCH":
            assert kwargs.get("content_type") == "application/merge-patch+json"
            return self._store(_merge(stored, body))
        assert method == "DELETE", method
        del self.objects[name]
        return {}

    async def send(self, method: str, path: str, **kwargs: Any) -> None:
        await self.json(method, path, **kwargs)

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        await asyncio.Event().wait()  # a watch: open, and nothing changes

    def _store(self, lease: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        lease["metadata"]["resourceVersion"] = str(self.version)
        self.objects[lease["metadata"]["name"]] = lease
        return self._copy(lease)

    @staticmethod
    def _copy(value: dict[str, Any]) -> dict[str, Any]:
        copied: dict[str, Any] = json.loads(json.dumps(value))
        return copied
