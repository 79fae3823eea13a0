"""Runs' policies on Kubernetes: one ConfigMap per run, so every gateway replica agrees on the version."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sandfleet.core import api
from sandfleet.core.policy_versions import PolicyError, RunPolicy
from sandfleet.kube.api_calls import KubeClient
from sandfleet.kube.errors import KubeError

POLICY_KEY = "policy.json"
RUN_ANNOTATION = f"{api.GROUP}/run"
OWNER_ANNOTATION = f"{api.GROUP}/run-owner"  # the caller that created the run, policy or not
CACHE_SECONDS = 1.0  # acquires read the policy at most once a second per run per gateway


def configmap_name(run: str) -> str:
    """A valid, stable ConfigMap name for any run name (hashed: run names are free-form)."""
    digest = hashlib.sha256(run.encode()).hexdigest()[:16]
    return f"sandfleet-run-{digest}"


class ConfigMapPolicyStore:
    """A PolicyStore over ConfigMaps in the gateway's namespace; writes are conditional."""

    def __init__(
        self, namespace: str, kube: Callable[[], KubeClient], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.namespace = namespace
        self._kube = kube  # the backend's client, which exists once the backend has started
        self.clock = clock
        # run -> (read at, policy, resourceVersion, owner)
        self._cache: dict[str, tuple[float, RunPolicy | None, str | None, str | None]] = {}
        # A read or claim of a run in flight, shared by every acquire that needs it meanwhile: a
        # new run's first step (hundreds of acquires at once) costs one read and one create, not
        # one each (measured: a 90-acquire burst of a new run spent 7 ms of gateway CPU per lease).
        self._flights: dict[tuple[str, str], asyncio.Future[Any]] = {}

    async def get(self, run: str) -> RunPolicy | None:
        return (await self._cached(run))[1]

    async def owner(self, run: str) -> str | None:
        return (await self._cached(run))[3]

    async def _cached(self, run: str) -> tuple[float, RunPolicy | None, str | None, str | None]:
        cached = self._cache.get(run)
        if cached is not None and self.clock() - cached[0] < CACHE_SECONDS:
            return cached
        await self._once(("read", run), lambda: self._read(run))
        return self._cache[run]

    async def _once(self, key: tuple[str, str], call: Callable[[], Awaitable[Any]]) -> Any:
        """`call()`, or the result of the same call already in flight."""
        flight = self._flights.get(key)
        if flight is None:
            flight = asyncio.ensure_future(call())
            self._flights[key] = flight
            flight.add_done_callback(lambda _: self._flights.pop(key, None))
        return await asyncio.shield(flight)

    async def _read(self, run: str) -> tuple[RunPolicy | None, str | None]:
        try:
            cm = await self._kube().json("GET", self._path(configmap_name(run)))
        except KubeError as error:
            if error.status != 404:
                raise
            self._cache[run] = (self.clock(), None, None, None)
            return None, None
        raw = (cm.get("data") or {}).get(POLICY_KEY)
        policy = RunPolicy.from_json(raw) if raw else None
        metadata = cm.get("metadata") or {}
        version = metadata.get("resourceVersion")
        owner = (metadata.get("annotations") or {}).get(OWNER_ANNOTATION) or (
            policy.owner if policy else None
        )
        self._cache[run] = (self.clock(), policy, version, owner or None)
        return policy, version

    async def claim(self, run: str, owner: str) -> str:
        """Create the run's ConfigMap naming `owner` (no policy yet); whoever created it first wins.

        Claims of one run in flight at once are one claim: its owner is the answer for all of them
        (a caller other than the owner then finds the run taken, as it would a moment later).
        """
        answer: str = await self._once(("claim", run), lambda: self._claim(run, owner))
        return answer

    async def _claim(self, run: str, owner: str) -> str:
        policy, resource_version = await self._read(run)
        current = self._cache[run][3]
        if current is not None:
            return current
        try:  # a run stored before runs had owners keeps its policy
            await self._write(run, owner, policy, resource_version)
        except KubeError as error:
            if error.status != 409:
                raise
            await self._read(run)  # another replica created (or claimed) it first
            return self._cache[run][3] or owner
        self._cache[run] = (self.clock(), self._cache[run][1], None, owner)
        return owner

    async def put(self, policy: RunPolicy) -> None:
        # Read fresh (not the cache) so the write is conditional on what another replica last wrote.
        current, resource_version = await self._read(policy.run)
        if current is not None and policy.version < current.version:
            raise PolicyError(
                f"run {policy.run!r} is at policy version {current.version} (published by another "
                f"gateway); {policy.version} would go backwards"
            )
        owner = self._cache[policy.run][3] or policy.owner
        try:
            await self._write(policy.run, owner, policy, resource_version)
        except KubeError as error:
            if error.status == 409:
                raise PolicyError(
                    f"run {policy.run!r}'s policy was changed by another gateway at the same moment; retry"
                ) from None
            raise
        self._cache[policy.run] = (self.clock(), policy, None, owner or None)

    async def _write(
        self, run: str, owner: str, policy: RunPolicy | None, resource_version: str | None
    ) -> None:
        """Create the run's ConfigMap, or replace it conditionally on `resource_version`."""
        annotations = {RUN_ANNOTATION: run}
        if owner:
            annotations[OWNER_ANNOTATION] = owner
        metadata: dict[str, Any] = {
            "name": configmap_name(run),
            "labels": {api.MANAGED_BY_LABEL: api.MANAGED_BY},
            "annotations": annotations,
        }
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata,
            "data": {POLICY_KEY: policy.to_json()} if policy is not None else {},
        }
        if resource_version is None:
            await self._kube().send("POST", self._path(), body=body)
        else:
            metadata["resourceVersion"] = resource_version
            await self._kube().send("PUT", self._path(configmap_name(run)), body=body)

    def _path(self, name: str = "") -> str:
        collection = f"/api/v1/namespaces/{self.namespace}/configmaps"
        return f"{collection}/{name}" if name else collection
