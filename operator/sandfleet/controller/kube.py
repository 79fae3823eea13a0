"""The operator's calls on the Kubernetes API: Pod writes, pool status, Events, informers.

All of it goes through sandfleet.kube (one client, one informer); this module only knows which paths
and bodies the operator needs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from sandfleet.core import api
from sandfleet.core.timestamps import format_micro_time
from sandfleet.kube.api_calls import MERGE_PATCH, KubeClient
from sandfleet.kube.config import ApiClient, api_client, load_configuration
from sandfleet.kube.errors import KubeError
from sandfleet.kube.informer import EventHandler, Informer

__all__ = ["Kube", "KubeError", "connect"]

# A fill issues hundreds of creates at once; a small pool would serialise them.
POOL_SIZE = 128


async def connect(pool_size: int = POOL_SIZE) -> ApiClient:
    """An API client from the kubeconfig, else the in-cluster identity; KubeConfigError without either."""
    return api_client(await load_configuration(), pool_size)


class Kube(KubeClient):
    """The operator's API calls on one ApiClient."""

    async def list_and_watch(
        self,
        path: str,
        on_event: EventHandler,
        on_synced: Callable[[], None],
        query: Mapping[str, str] | None = None,
    ) -> None:
        """Keep `on_event` current with `path` forever (see sandfleet.kube.informer)."""
        await Informer(self, path, on_event, on_synced, query=query).run()

    # -- sandbox Pods -------------------------------------------------------------------------------

    async def create_pod(self, namespace: str, pod: dict[str, Any]) -> None:
        await self.send("POST", f"/api/v1/namespaces/{namespace}/pods", body=pod)

    async def delete_pod(
        self, namespace: str, name: str, force: bool = False, resource_version: str = ""
    ) -> bool:
        """Delete a Pod, only if still at `resource_version` when given; False on that conflict (409).

        The precondition is what keeps a delete decided on a free sandbox from landing on one a
        gateway has leased since: either the claim's patch or the delete wins, never both.
        """
        body: dict[str, Any] = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": "Background",
        }
        if force:
            body["gracePeriodSeconds"] = 0
        if resource_version:
            body["preconditions"] = {"resourceVersion": resource_version}
        try:
            await self.send("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body=body)
        except KubeError as error:
            if error.status == 409:
                return False
            if error.status != 404:
                raise
        return True

    # -- pools --------------------------------------------------------------------------------------

    async def patch_pool_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        path = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{namespace}/{api.POOL_PLURAL}/{name}/status"
        try:
            await self.send("PATCH", path, body={"status": status}, content_type=MERGE_PATCH)
        except KubeError as error:
            if error.status != 404:  # the pool was deleted meanwhile
                raise

    async def post_event(
        self, involved: Mapping[str, str], event_type: str, reason: str, message: str, source: str
    ) -> None:
        """An Event on a pool: for what a user must know, never for every Pod."""
        namespace = involved["namespace"]
        now = format_micro_time(time.time())
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
            await self.send("POST", f"/api/v1/namespaces/{namespace}/events", body=body)
