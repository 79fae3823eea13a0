"""What the gateway knows about each sandbox, and which warm one a lease should take."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sandfleet.core import api
from sandfleet.core.leases import Lease, lease_from_annotations


@dataclass(frozen=True)
class Sandbox:
    """One sandbox as seen in its Pod: enough to claim it and to reach its agent."""

    namespace: str
    name: str
    pool: str
    region: str
    resource_version: str
    state: str  # api.LEASE_FREE / LEASE_LEASED / LEASE_RELEASED
    ready: bool
    terminating: bool
    address: str | None
    port: int
    lease: Lease | None
    created_at: float = 0.0
    image_key: str = ""  # which image it runs (sandfleet.core.model.image_key), for leases by image

    @property
    def key(self) -> str:
        """Namespaced name; it is also the lease id (a Pod is leased once, then deleted)."""
        return f"{self.namespace}.{self.name}"

    @property
    def warm(self) -> bool:
        return self.state == api.LEASE_FREE and self.ready and not self.terminating

    def agent_url(self) -> str | None:
        return f"http://{self.address}:{self.port}" if self.address else None


def split_lease_id(lease_id: str) -> tuple[str, str] | None:
    """(namespace, pod name) of a lease id, or None when it is not one of ours."""
    namespace, dot, name = lease_id.partition(".")
    if not dot or not namespace or not name or len(lease_id) > 317:
        return None
    return namespace, name


def sandbox_from_pod(pod: Mapping[str, Any]) -> Sandbox | None:
    """Read a sandbox out of a Pod (as a plain dict); None for Pods that are not sandboxes."""
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    pool = labels.get(api.POOL_LABEL)
    if not pool:
        return None
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    port = api.DEFAULT_AGENT_PORT
    for container in spec.get("containers") or []:
        if container.get("name") == api.SANDBOX_CONTAINER:
            for declared in container.get("ports") or []:
                port = int(declared.get("containerPort", port))
    return Sandbox(
        namespace=metadata.get("namespace", ""),
        name=metadata.get("name", ""),
        pool=pool,
        region=labels.get(api.SANDBOX_REGION_LABEL, ""),
        resource_version=str(metadata.get("resourceVersion", "")),
        state=labels.get(api.LEASE_STATE_LABEL, api.LEASE_FREE),
        ready=ready and status.get("phase") == "Running",
        terminating=metadata.get("deletionTimestamp") is not None,
        address=status.get("podIP"),
        port=port,
        lease=lease_from_annotations(metadata.get("annotations")),
        created_at=_timestamp(metadata.get("creationTimestamp")),
        image_key=labels.get(api.IMAGE_KEY_LABEL, ""),
    )


def _timestamp(value: Any) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str) and value:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return 0.0


def pick_warm(
    candidates: Iterable[Sandbox], regions: tuple[str, ...], skip: frozenset[str] = frozenset()
) -> list[Sandbox]:
    """Warm sandboxes in the order a lease should try them: preferred regions first, then the rest.

    Within a region the oldest goes first, so warm sandboxes turn over instead of aging.
    """
    rank = preference_rank(regions)
    warm = [s for s in candidates if s.warm and s.key not in skip]
    return sorted(warm, key=lambda s: (rank.get(s.region, len(rank)), s.created_at, s.name))


def preference_rank(regions: tuple[str, ...]) -> dict[str, int]:
    """Each preferred region's rank, by its first mention (a repeated region keeps its place)."""
    rank: dict[str, int] = {}
    for region in regions:
        rank.setdefault(region, len(rank))
    return rank
