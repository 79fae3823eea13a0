"""What the lease service needs from a runtime: pools, a live index of sandboxes, conditional writes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sandfleet.core.leases import LeaseRecord
from sandfleet.core.model import RegionSpec, Sandbox
from sandfleet.core.warm_index import WarmIndex


@dataclass(frozen=True)
class PoolInfo:
    """The parts of a SandboxPool the gateway uses."""

    namespace: str
    name: str
    default_ttl_seconds: int
    max_ttl_seconds: int
    regions: tuple[str, ...]
    image: str
    # The most sandboxes (warm, starting and leased) the pool may ever hold: a group or a prefetch
    # above it can never be served, so it is refused at once.
    max_sandboxes: int = RegionSpec(name="").max_sandboxes
    # Whether a prefetch can warm images other than the template's (the local runtime runs one):
    # when not, an acquire for another image can never be served and is refused at once.
    other_images: bool = True


class Backend(Protocol):
    """A runtime (Kubernetes or local gVisor) seen from the lease service.

    Writes are conditional: `claim` succeeds only if the sandbox is unchanged since it was read,
    which is what makes a double lease impossible however many gateways run.
    """

    def pool(self, name: str) -> PoolInfo | None: ...

    def pools(self) -> list[PoolInfo]: ...

    def sandboxes(self, pool: str | None = None) -> list[Sandbox]: ...

    def sandbox(self, lease_id: str) -> Sandbox | None: ...

    def leased_with_key(self, holder: str, idempotency_key: str) -> list[Sandbox]:
        """Sandboxes whose lease `holder` acquired with `idempotency_key` (any state), from an index."""

    def warm(self, pool: str, image_key: str) -> WarmIndex:
        """The live index of the shelf's warm sandboxes, kept current as sandboxes change.

        The lease service takes the sandboxes it claims out of it (a claim's write puts them back
        when it fails, or moves them out for good when it succeeds); every other change is the
        backend's to apply.
        """

    def subscribe(self, on_change: Callable[[Sandbox], None]) -> None:
        """Call `on_change` whenever a sandbox is added or changes (e.g. becomes warm)."""

    async def claim(self, sandbox: Sandbox, lease: LeaseRecord) -> Sandbox | None:
        """Put `lease` on `sandbox` if nobody changed it since it was read; None if somebody did."""

    async def write_lease(self, sandbox: Sandbox, lease: LeaseRecord) -> Sandbox | None:
        """Replace the lease on a leased sandbox (renewal), conditionally like `claim`."""

    async def unclaim(self, sandbox: Sandbox) -> None:
        """Take back a claim nobody received: warm again, unless somebody wrote it since."""

    async def release(self, sandbox: Sandbox) -> None:
        """Mark the sandbox released; the runtime destroys it off the critical path."""

    async def fresh(self, lease_id: str) -> Sandbox | None:
        """Read one sandbox from the source of truth (not the index), None if it is gone."""

    async def prefetch(self, pool: str, image: str, count: int, ttl_seconds: int) -> str:
        """Ask for `count` warm sandboxes of `image` for a while; the name of what was written."""
