"""The operator's only contact with the Kubernetes API: list+watch, Pod writes, status, Events, Leases.

Everything here is asyncio (kubernetes_asyncio over aiohttp); nothing blocks the event loop. Reads
skip the generated model classes and decode JSON straight into dicts: at 10,000 Pods the models
cost more CPU and memory than the rest of the operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config

from sandfleet.core import api

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
WATCH_SECONDS = 290
LIST_PAGE = 1000
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=30)
LIST_TIMEOUT = aiohttp.ClientTimeout(total=120)
# A watch retries at most this far apart (plus jitter): after an apiserver restart the operator must
# see the cluster again within seconds, or released and expired sandboxes wait and pools stay short.
WATCH_BACKOFF_MAX = 5.0
WATCH_TIMEOUT = aiohttp.ClientTimeout(connect=10, sock_connect=10, sock_read=WATCH_SECONDS + 30)

EventHandler = Callable[[str, dict[str, Any]], None]


class KubeError(Exception):
    """An API call answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


async def connect(pool_size: int = 128) -> client.ApiClient:
    """An API client from the in-cluster config, else from KUBECONFIG / ~/.kube/config."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        await config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    # A fill issues hundreds of creates at once; a small pool would serialise them.
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Kube:
    """Thin async calls on one ApiClient."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client

    async def close(self) -> None:
        await self.api_client.close()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int | bool] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        deadline: aiohttp.ClientTimeout | None = None,
    ) -> aiohttp.ClientResponse:
        response: aiohttp.ClientResponse = await self.api_client.call_api(
            path,
            method,
            query_params=[
                (k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in (query or {}).items()
            ],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=deadline or REQUEST_TIMEOUT,
        )
        if response.status >= 400:
            text = await response.text()
            response.release()
            try:
                message = json.loads(text).get("message", text)
            except ValueError:
                message = text
            raise KubeError(response.status, str(message))
        return response

    async def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = await self._call(method, path, **kwargs)
        try:
            data: dict[str, Any] = json.loads(await response.read())
            return data
        finally:
            response.release()

    # -- informers ---------------------------------------------------------------------------------

    async def list_and_watch(
        self,
        path: str,
        on_event: EventHandler,
        on_synced: Callable[[], None],
        query: Mapping[str, str] | None = None,
    ) -> None:
        """List `path` (paged), then follow its watch forever; relist when the history is gone.

        `on_event(type, object)` sees ADDED for every listed object, then the watch's events; a relist
        replays the whole collection as ADDED with a SYNC marker first so the consumer can drop
        what vanished meanwhile.
        """
        backoff = 0.5
        while True:  # until cancelled
            try:
                version: str | None = await self._list(path, on_event, query)
                on_synced()
                backoff = 0.5
                while version is not None:  # None: 410 Gone, the history is gone, relist
                    version = await self._watch(path, version, on_event, query)
            except asyncio.CancelledError:
                raise
            except (TimeoutError, KubeError, aiohttp.ClientError, OSError, ValueError) as error:
                log.warning("watch on %s failed (%s); retrying in %.1fs", path, error, backoff)
                await asyncio.sleep(backoff + random.random() * backoff)
                backoff = min(WATCH_BACKOFF_MAX, backoff * 2)
            except Exception:
                # A bug in a consumer must not silently end the watch: the cache would go stale forever.
                log.exception("watch on %s broke; relisting in %.1fs", path, backoff)
                await asyncio.sleep(backoff)
                backoff = min(WATCH_BACKOFF_MAX, backoff * 2)

    async def _list(self, path: str, on_event: EventHandler, query: Mapping[str, str] | None) -> str:
        token = ""
        on_event("SYNC", {})
        while True:
            params: dict[str, str | int | bool] = {**(query or {}), "limit": LIST_PAGE}
            if token:
                params["continue"] = token
            page = await self._json("GET", path, query=params, deadline=LIST_TIMEOUT)
            for item in page.get("items") or ():
                on_event("ADDED", item)
            metadata = page.get("metadata") or {}
            token = metadata.get("continue") or ""
            if not token:
                return str(metadata.get("resourceVersion", ""))

    async def _watch(
        self, path: str, version: str, on_event: EventHandler, query: Mapping[str, str] | None
    ) -> str | None:
        params: dict[str, str | int | bool] = {
            **(query or {}),
            "watch": True,
            "resourceVersion": version,
            "allowWatchBookmarks": True,
            "timeoutSeconds": WATCH_SECONDS,
        }
        response = await self._call("GET", path, query=params, deadline=WATCH_TIMEOUT)
        try:
            while True:
                line = await response.content.readline()
                if not line:
                    return version
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        return None
                    raise KubeError(int(obj.get("code", 500)), str(obj.get("message")))
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind != "BOOKMARK":
                    on_event(str(kind), obj)
        finally:
            response.release()

    # -- sandbox Pods -------------------------------------------------------------------------------

    async def create_pod(self, namespace: str, pod: dict[str, Any]) -> None:
        response = await self._call("POST", f"/api/v1/namespaces/{namespace}/pods", body=pod)
        response.release()

    async def delete_pod(self, namespace: str, name: str, force: bool = False) -> None:
        body: dict[str, Any] = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": "Background",
        }
        if force:
            body["gracePeriodSeconds"] = 0
        try:
            response = await self._call("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body=body)
            response.release()
        except KubeError as error:
            if error.status != 404:
                raise

    # -- pools --------------------------------------------------------------------------------------

    async def patch_pool_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        path = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{namespace}/{api.POOL_PLURAL}/{name}/status"
        try:
            response = await self._call("PATCH", path, body={"status": status}, content_type=MERGE_PATCH)
            response.release()
        except KubeError as error:
            if error.status != 404:  # the pool was deleted meanwhile
                raise

    async def post_event(
        self, involved: Mapping[str, str], event_type: str, reason: str, message: str, source: str
    ) -> None:
        """An Event on a pool: for what a user must know, never for every Pod."""
        namespace = involved["namespace"]
        now = _now_rfc3339()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": api.API_VERSION,
                "kind": api.POOL_KIND,
                "name": involved["name"],
                "namespace": namespace,
                "uid": involved["uid"],
            },
            "type": event_type,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": source},
            "reportingComponent": source,
            "reportingInstance": source,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        with contextlib.suppress(KubeError):
            response = await self._call("POST", f"/api/v1/namespaces/{namespace}/events", body=body)
            response.release()

    # -- leader election (coordination.k8s.io Leases) ------------------------------------------------

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._json(
                "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
            )
        except KubeError as error:
            if error.status == 404:
                return None
            raise

    async def create_lease(self, namespace: str, name: str, spec: Mapping[str, Any]) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name},
            "spec": spec,
        }
        try:
            await self._json("POST", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases", body=body)
            return True
        except KubeError as error:
            if error.status == 409:
                return False
            raise

    async def replace_lease(self, namespace: str, lease: Mapping[str, Any]) -> bool:
        """Write `lease` back; False when someone else wrote it first (resourceVersion conflict)."""
        name = lease["metadata"]["name"]
        try:
            await self._json(
                "PUT", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}", body=lease
            )
            return True
        except KubeError as error:
            if error.status == 409:
                return False
            raise
