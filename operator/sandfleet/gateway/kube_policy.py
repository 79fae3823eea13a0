"""Runs' policies on Kubernetes: one ConfigMap per run, so every gateway replica agrees on the version."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from sandfleet.core import api
from sandfleet.core.policy import PolicyError, RunPolicy

POLICY_KEY = "policy.json"
RUN_ANNOTATION = f"{api.GROUP}/run"
CACHE_SECONDS = 1.0  # acquires read the policy at most once a second per run per gateway


def configmap_name(run: str) -> str:
    """A valid, stable ConfigMap name for any run name (hashed: run names are free-form)."""
    digest = hashlib.sha256(run.encode()).hexdigest()[:16]
    return f"sandfleet-run-{digest}"


class ConfigMapPolicyStore:
    """A PolicyStore over ConfigMaps in the gateway's namespace; writes are conditional."""

    def __init__(
        self, namespace: str, core: Callable[[], Any], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.namespace = namespace
        self._core = core  # the backend's CoreV1Api, which exists once the backend has started
        self.clock = clock
        self._cache: dict[str, tuple[float, RunPolicy | None, str | None]] = {}

    async def get(self, run: str) -> RunPolicy | None:
        cached = self._cache.get(run)
        if cached is not None and self.clock() - cached[0] < CACHE_SECONDS:
            return cached[1]
        return (await self._read(run))[0]

    async def _read(self, run: str) -> tuple[RunPolicy | None, str | None]:
        try:
            cm = await self._core().read_namespaced_config_map(configmap_name(run), self.namespace)
        except ApiException as error:
            if error.status != 404:
                raise
            self._cache[run] = (self.clock(), None, None)
            return None, None
        raw = (cm.data or {}).get(POLICY_KEY)
        policy = RunPolicy.from_json(raw) if raw else None
        version = cm.metadata.resource_version
        self._cache[run] = (self.clock(), policy, version)
        return policy, version

    async def put(self, policy: RunPolicy) -> None:
        # Read fresh (not the cache) so the write is conditional on what another replica last wrote.
        current, resource_version = await self._read(policy.run)
        if current is not None and policy.version < current.version:
            raise PolicyError(
                f"run {policy.run!r} is at policy version {current.version} (published by another "
                f"gateway); {policy.version} would go backwards"
            )
        metadata: dict[str, Any] = {
            "name": configmap_name(policy.run),
            "labels": {api.MANAGED_BY_LABEL: api.MANAGED_BY},
            "annotations": {RUN_ANNOTATION: policy.run},
        }
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata,
            "data": {POLICY_KEY: policy.to_json()},
        }
        try:
            if resource_version is None:
                await self._core().create_namespaced_config_map(self.namespace, body)
            else:
                metadata["resourceVersion"] = resource_version
                name = configmap_name(policy.run)
                await self._core().replace_namespaced_config_map(name, self.namespace, body)
        except ApiException as error:
            if error.status == 409:
                raise PolicyError(
                    f"run {policy.run!r}'s policy was changed by another gateway at the same moment; retry"
                ) from None
            raise
        self._cache[policy.run] = (self.clock(), policy, None)
