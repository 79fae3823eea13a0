"""The gateway's only contact with the Kubernetes API: watches that feed the index, conditional writes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from sandfleet.core import api, model
from sandfleet.core.lease_keys import LeaseKeys
from sandfleet.core.leases import LeaseRecord, lease_metadata, release_metadata, unclaim_metadata
from sandfleet.core.model import Sandbox, image_key, split_lease_id
from sandfleet.core.pods import sandbox_from_pod
from sandfleet.core.warm_index import WarmIndex, WarmShelves
from sandfleet.gateway.backend import PoolInfo

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
WATCH_SECONDS = 290  # under the apiserver's default --min-request-timeout jitter window


async def load_client_config() -> client.ApiClient:
    """An API client from the in-cluster config, else from KUBECONFIG / ~/.kube/config."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        await config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    # Every concurrent claim is a request; the default pool of 4 connections would queue them.
    configuration.connection_pool_maxsize = 64
    return client.ApiClient(configuration)


def pool_from_object(obj: dict[str, Any]) -> PoolInfo:
    pool = model.pool_from_object(obj)
    return PoolInfo(
        namespace=pool.namespace,
        name=pool.name,
        default_ttl_seconds=pool.lease.default_ttl_seconds,
        max_ttl_seconds=pool.lease.max_ttl_seconds,
        regions=tuple(r.name for r in pool.regions),
        image=pool.template.image,
        max_sandboxes=pool.max_sandboxes,
    )


class KubeBackend:
    """A Backend over the Kubernetes API: pools and sandbox Pods in one namespace."""

    def __init__(
        self,
        namespace: str,
        connect: Callable[[], Awaitable[client.ApiClient]] = load_client_config,
        token_audiences: list[str] | None = None,
    ) -> None:
        self.namespace = namespace
        # A token minted for the gateway's own audience is useless against the apiserver itself.
        self.token_audiences = token_audiences or None
        self._connect = connect
        self._sandboxes: dict[str, Sandbox] = {}
        self._by_pool: dict[str, dict[str, Sandbox]] = {}  # so a lease scans its pool, not all
        self._warm = WarmShelves()  # so a lease touches only the sandboxes it takes
        self._lease_keys = LeaseKeys()  # so a retried acquire does not scan every sandbox
        self._pools: dict[str, PoolInfo] = {}
        self._listeners: list[Callable[[Sandbox], None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.synced = asyncio.Event()
        self._pods_synced = asyncio.Event()
        self._pools_synced = asyncio.Event()
        self.connected = True

    # -- Backend: reads come from the watch-fed index, never from a list on the hot path --------

    def pool(self, name: str) -> PoolInfo | None:
        return self._pools.get(name)

    def pools(self) -> list[PoolInfo]:
        return sorted(self._pools.values(), key=lambda p: p.name)

    def sandboxes(self, pool: str | None = None) -> list[Sandbox]:
        if pool is None:
            return list(self._sandboxes.values())
        return list(self._by_pool.get(pool, {}).values())

    def sandbox(self, lease_id: str) -> Sandbox | None:
        return self._sandboxes.get(lease_id)

    def warm(self, pool: str, image_key: str) -> WarmIndex:
        return self._warm.shelf(pool, image_key)

    def leased_with_key(self, holder: str, idempotency_key: str) -> list[Sandbox]:
        return self._lease_keys.find(holder, idempotency_key)

    def subscribe(self, on_change: Callable[[Sandbox], None]) -> None:
        self._listeners.append(on_change)

    # -- Backend: conditional writes -----------------------------------------------------------

    async def claim(self, sandbox: Sandbox, lease: LeaseRecord) -> Sandbox | None:
        return await self._patch(sandbox, lease_metadata(lease))

    async def write_lease(self, sandbox: Sandbox, lease: LeaseRecord) -> Sandbox | None:
        return await self._patch(sandbox, lease_metadata(lease))

    async def unclaim(self, sandbox: Sandbox) -> None:
        # Conditional on the claim's own version: if anybody wrote since (a retry of the same
        # request adopted the lease through another replica), the lease is theirs and stays.
        with contextlib.suppress(ApiException):
            await self._patch(sandbox, unclaim_metadata())

    async def release(self, sandbox: Sandbox) -> None:
        # Unconditional: releasing twice, or after a renewal elsewhere, must still release.
        with contextlib.suppress(ApiException):
            await self._patch(sandbox, release_metadata(), conditional=False)

    async def fresh(self, lease_id: str) -> Sandbox | None:
        parts = split_lease_id(lease_id)
        if parts is None or parts[0] != self.namespace:
            return None
        try:
            response = await self.core.read_namespaced_pod(parts[1], parts[0], _preload_content=False)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        found = sandbox_from_pod(json.loads(await response.read()))
        if found is not None:
            self._upsert(found)
        return found

    async def _patch(
        self, sandbox: Sandbox, metadata: dict[str, Any], conditional: bool = True
    ) -> Sandbox | None:
        body: dict[str, Any] = {"metadata": dict(metadata)}
        if conditional:
            # The precondition that makes a claim atomic: a stale resourceVersion is a 409.
            body["metadata"]["resourceVersion"] = sandbox.resource_version
        try:
            response = await self.core.patch_namespaced_pod(
                sandbox.name,
                sandbox.namespace,
                body,
                _content_type=MERGE_PATCH,
                _preload_content=False,
            )
        except ApiException as error:
            if error.status in (404, 409):
                return None
            raise
        updated = sandbox_from_pod(json.loads(await response.read()))
        if updated is not None:
            self._upsert(updated)
        return updated

    async def prefetch(self, pool: str, image: str, count: int, ttl_seconds: int) -> str:
        """Server-side apply a SandboxPrewarm; the operator warms the image for its TTL.

        `expiresAt` moves with every call, so prefetching the same image again extends it (a
        re-apply of identical content would not count as a write).
        """
        name = f"{pool}-{image_key(image)}"[:253]
        expires = datetime.fromtimestamp(time.time() + ttl_seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": api.API_VERSION,
            "kind": api.PREWARM_KIND,
            "metadata": {"name": name, "labels": {api.POOL_LABEL: pool}},
            "spec": {
                "pool": pool,
                "image": image,
                "count": count,
                "ttlSeconds": ttl_seconds,
                "expiresAt": expires,
            },
        }
        await self.custom.patch_namespaced_custom_object(
            api.GROUP,
            api.VERSION,
            self.namespace,
            api.PREWARM_PLURAL,
            name,
            body,
            field_manager="sandfleet-gateway",
            force=True,
            _content_type="application/apply-patch+yaml",
        )
        return name

    # -- reviews for authentication and authorization -----------------------------------------

    async def review_token(self, token: str) -> tuple[str, list[str]] | None:
        """The user a bearer token belongs to, by TokenReview; None if the apiserver rejects it."""
        review = client.V1TokenReview(
            spec=client.V1TokenReviewSpec(token=token, audiences=self.token_audiences)
        )
        result = await client.AuthenticationV1Api(self.api_client).create_token_review(review)
        if not result.status or not result.status.authenticated:
            return None
        return result.status.user.username, list(result.status.user.groups or [])

    async def may_use_pool(self, user: str, groups: list[str], pool: str) -> bool:
        """Whether RBAC lets `user` use `pool` (verb "use" on sandboxpools), by SubjectAccessReview."""
        review = client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=user,
                groups=groups,
                resource_attributes=client.V1ResourceAttributes(
                    group=api.GROUP,
                    resource=api.POOL_PLURAL,
                    verb="use",
                    name=pool,
                    namespace=self.namespace,
                ),
            )
        )
        result = await client.AuthorizationV1Api(self.api_client).create_subject_access_review(review)
        return bool(result.status and result.status.allowed)

    # -- the watches ---------------------------------------------------------------------------

    async def start(self, sync_timeout: float = 60.0) -> None:
        """Connect, list and start watching; returns once the index holds every sandbox."""
        self.api_client = await self._connect()
        # Typed as Any: we call with _preload_content=False / _content_type, which the stubs omit.
        self.core: Any = client.CoreV1Api(self.api_client)
        self.custom: Any = client.CustomObjectsApi(self.api_client)
        self._tasks = [
            asyncio.create_task(self._watch_forever("pods", self._list_pods, self._on_pod)),
            asyncio.create_task(self._watch_forever("pools", self._list_pools, self._on_pool)),
            asyncio.create_task(self._mark_synced()),
        ]
        await asyncio.wait_for(self.synced.wait(), timeout=sync_timeout)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.api_client.close()

    async def _mark_synced(self) -> None:
        await self._pods_synced.wait()
        await self._pools_synced.wait()
        self.synced.set()

    async def _list_pods(self, **kwargs: Any) -> Any:
        return await self.core.list_namespaced_pod(
            self.namespace, label_selector=api.POOL_LABEL, _preload_content=False, **kwargs
        )

    async def _list_pools(self, **kwargs: Any) -> Any:
        return await self.custom.list_namespaced_custom_object(
            api.GROUP, api.VERSION, self.namespace, api.POOL_PLURAL, _preload_content=False, **kwargs
        )

    async def _watch_forever(
        self,
        what: str,
        lister: Callable[..., Any],
        handle: Callable[[str, dict[str, Any]], None],
    ) -> None:
        """List once, then watch from that resourceVersion; relist on 410 Gone or any break."""
        backoff = 0.2
        while True:
            try:
                listed = json.loads(await (await lister()).read())
                self._replace_all(what, listed.get("items") or [], handle)
                version = listed["metadata"]["resourceVersion"]
                self.connected = True
                backoff = 0.2
                while True:
                    version = await self._watch_once(lister, version, handle)
            except asyncio.CancelledError:
                raise
            except _Gone:
                continue
            except Exception as error:  # the apiserver went away: keep serving what we know
                self.connected = False
                log.warning("watching %s failed (%s); retrying in %.1fs", what, error, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _watch_once(
        self, lister: Callable[..., Any], version: str, handle: Callable[[str, dict[str, Any]], None]
    ) -> str:
        response = await lister(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
        )
        async with response:
            async for line in response.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone
                    raise RuntimeError(obj.get("message", "watch error"))
                version = obj.get("metadata", {}).get("resourceVersion", version)
                if event.get("type") != "BOOKMARK":
                    handle(event["type"], obj)
        return version

    def _replace_all(
        self, what: str, items: list[dict[str, Any]], handle: Callable[[str, dict[str, Any]], None]
    ) -> None:
        if what == "pods":
            self._sandboxes.clear()
            self._by_pool.clear()
            self._warm.clear()
            self._lease_keys.clear()
        else:
            self._pools.clear()
        for item in items:
            handle("ADDED", item)
        (self._pods_synced if what == "pods" else self._pools_synced).set()

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        sandbox = sandbox_from_pod(pod)
        if sandbox is None:
            return
        if kind == "DELETED":
            self._sandboxes.pop(sandbox.key, None)
            self._by_pool.get(sandbox.pool, {}).pop(sandbox.key, None)
            self._warm.remove(sandbox)
            self._lease_keys.remove(sandbox.key)
            return
        self._upsert(sandbox)

    def _upsert(self, sandbox: Sandbox) -> None:
        known = self._sandboxes.get(sandbox.key)
        if known is not None and _newer(known.resource_version, sandbox.resource_version):
            return  # a late watch event must not roll back what a write already told us
        self._sandboxes[sandbox.key] = sandbox
        self._by_pool.setdefault(sandbox.pool, {})[sandbox.key] = sandbox
        self._warm.update(sandbox)
        self._lease_keys.update(sandbox)
        for listener in self._listeners:
            listener(sandbox)

    def _on_pool(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self._pools.pop(name, None)
        else:
            self._pools[name] = pool_from_object(obj)


class _Gone(Exception):
    """The watch's resourceVersion is too old: relist."""


def _newer(known: str, incoming: str) -> bool:
    """Whether `known` is strictly newer (resourceVersions are etcd revisions, compared as ints)."""
    try:
        return int(known) > int(incoming)
    except ValueError:
        return False
