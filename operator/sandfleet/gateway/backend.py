"""What the lease service needs from a runtime: pools, a live index of sandboxes, conditional writes."""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Protocol

from sandfleet.core import api
from sandfleet.core.lease_keys import LeaseKeys
from sandfleet.core.leases import LeaseRecord
from sandfleet.core.model import RegionSpec, SandboxPod, image_key, sandbox_key
from sandfleet.core.recycle import RecyclePolicy
from sandfleet.core.warm_index import WarmIndex, WarmShelves


class RuntimeAway(RuntimeError):
    """No cluster behind the gateway can answer now (every fleet member lost): a 503 to retry."""


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
    # Whether a prefetch can warm any image other than the template's (a cluster pulls what it is
    # asked for): when not, an acquire for an image outside `served_images` can never be served and
    # is refused at once.
    other_images: bool = True
    # Images besides the template's that the pool always serves (the local runtime's `--image`s).
    served_images: tuple[str, ...] = ()
    # Every task evaluate of its leases is scored in a clean sandbox of the same image, never in the
    # episode's own (gateway.clean_scoring): for episodes that may reach their sandbox's agent.
    clean_scoring: bool = False
    # Its episodes' commands run as the image's own User (root, for most task images): they can reach
    # the agent, so its scoring is always clean, and a sandbox lost mid-episode scores 0 (`failed`),
    # never a masked infra_error a policy could learn to trigger.
    commands_as_image_user: bool = False
    # spec.recycle: a released sandbox of a run is reset and kept for that run's next lease.
    recycle: RecyclePolicy | None = None
    # spec.lease.store: where new Pods' leases are written (each Pod says its own: SandboxPod.shard).
    store: str = api.STORE_LEDGER
    # Its FLEET_SHARE_ANNOTATION: the share of its warm target a fleet gateway gave this member.
    fleet_share: float | None = None
    # spec.replicas: the warm target a fleet splits over its members.
    replicas: int = 0
    # The most sandboxes this cluster can hold for the pool now, from its operator's status (what
    # it holds plus what its nodes still fit); None until the operator has said.
    room: int | None = None

    def serves(self, image: str) -> bool:
        """Whether `image` is the template's or one of `served_images` (compared by image key)."""
        return image_key(image) in {image_key(i) for i in (self.image, *self.served_images)}


class Backend(Protocol):
    """A runtime (Kubernetes or local gVisor) seen from the lease service.

    Writes are conditional: `claim` succeeds only if the sandbox is unchanged since it was read,
    which is what makes a double lease impossible however many gateways run.
    """

    def pool(self, name: str) -> PoolInfo | None: ...

    def pools(self) -> list[PoolInfo]: ...

    def sandboxes(self, pool: str | None = None) -> list[SandboxPod]: ...

    def sandbox(self, lease_id: str) -> SandboxPod | None:
        """The sandbox a lease id names (of any of its episodes), from the index."""

    def leased_with_key(self, holder: str, idempotency_key: str) -> list[SandboxPod]:
        """Sandboxes whose lease `holder` acquired with `idempotency_key` (any state), from an index."""

    async def refresh_keyed(self, holder: str, idempotency_key: str, pool: str) -> None:
        """Bring the index's sandboxes of `pool` leased under the key up to date with the source of truth.

        A retry decides what its caller was already answered with from them: another replica's
        writes must be seen in full, not as far as a watch has got.
        """

    def take_reserved(self, pool: str, image_key: str, holder: str, run: str, count: int) -> list[SandboxPod]:
        """Up to `count` sandboxes kept for `holder`'s `run`, taken out of the index.

        A recycling pool's, reset after the run's last episodes: its acquires claim them first.
        """

    def warm(self, pool: str, image_key: str) -> WarmIndex:
        """The live index of the shelf's warm sandboxes, kept current as sandboxes change.

        The lease service takes the sandboxes it claims out of it (a claim's write puts them back
        when it fails, or moves them out for good when it succeeds); every other change is the
        backend's to apply.
        """

    def subscribe(self, on_change: Callable[[SandboxPod], None]) -> None:
        """Call `on_change` whenever a sandbox is added or changes (e.g. becomes warm)."""

    async def claim(self, sandbox: SandboxPod, lease: LeaseRecord) -> SandboxPod | None:
        """Put `lease` on `sandbox` if nobody changed it since it was read; None if somebody did."""

    async def write_lease(self, sandbox: SandboxPod, lease: LeaseRecord) -> SandboxPod | None:
        """Replace the lease on a leased sandbox (renewal), conditionally like `claim`."""

    async def unclaim(self, sandbox: SandboxPod) -> None:
        """Take back a claim nobody received: warm again, unless somebody wrote it since."""

    async def release(self, sandbox: SandboxPod) -> None:
        """Mark the sandbox released; the runtime destroys it off the critical path."""

    async def fresh(self, lease_id: str) -> SandboxPod | None:
        """Read one sandbox from the source of truth (not the index), None if it is gone."""

    async def prefetch(self, pool: str, image: str, count: int, ttl_seconds: int) -> str:
        """Ask for `count` warm sandboxes of `image` for a while; the name of what was written."""

    def demand(self, pool: str, image_key: str, waiting: int) -> None:
        """Callers wait for `waiting` sandboxes of the shelf: a runtime that boots on demand starts some."""


Reservation = tuple[str, str, str, str]  # (pool, image key, holder, run)


class ReservedIndex:
    """Reset sandboxes by whose next lease they wait for, so a lease of that run finds them in O(1)."""

    def __init__(self) -> None:
        self._by_reservation: dict[Reservation, dict[str, SandboxPod]] = {}
        self._filed: dict[str, Reservation] = {}  # sandbox key -> where it is filed

    def update(self, sandbox: SandboxPod) -> None:
        self.remove(sandbox.key)
        if (
            sandbox.reserved
            and sandbox.reserved_for is not None
            and sandbox.ready
            and not sandbox.terminating
        ):
            where = (sandbox.pool, sandbox.image_key, *sandbox.reserved_for)
            self._by_reservation.setdefault(where, {})[sandbox.key] = sandbox
            self._filed[sandbox.key] = where

    def remove(self, key: str) -> None:
        where = self._filed.pop(key, None)
        if where is not None:
            members = self._by_reservation[where]
            del members[key]
            if not members:
                del self._by_reservation[where]

    def take(self, pool: str, image: str, holder: str, run: str, count: int) -> list[SandboxPod]:
        """Up to `count` sandboxes reserved for (holder, run) on the shelf, taken out of the index.

        Taken, so that concurrent acquires of the run do not race for the same ones; whatever
        becomes of the claim, the Pod's next change files it again.
        """
        members = self._by_reservation.get((pool, image, holder, run), {})
        taken = list(members.values())[:count]
        for sandbox in taken:
            self.remove(sandbox.key)
        return taken

    def clear(self) -> None:
        self._by_reservation.clear()
        self._filed.clear()


class SandboxIndex(MutableMapping[str, SandboxPod]):
    """Every backend's index: sandboxes by lease id, by pool, on warm shelves and by idempotency key.

    Storing (`index[key] = sandbox`) and deleting keep every view in step, silently, as a watch
    would; `put` also tells the listeners, which is what wakes waiting acquires.
    """

    def __init__(self) -> None:
        self._by_key: dict[str, SandboxPod] = {}
        self._by_pool: dict[str, dict[str, SandboxPod]] = {}  # so a lease scans its pool, not all
        self.shelves = WarmShelves()  # so a lease touches only the sandboxes it takes
        self.lease_keys = LeaseKeys()  # so a retried acquire does not scan every sandbox
        self.reserved = ReservedIndex()  # so a run's next lease finds what its last one left, reset
        self.listeners: list[Callable[[SandboxPod], None]] = []

    def __getitem__(self, key: str) -> SandboxPod:
        return self._by_key[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_key)

    def __len__(self) -> int:
        return len(self._by_key)

    def __setitem__(self, key: str, sandbox: SandboxPod) -> None:
        if key != sandbox.key:
            raise KeyError(f"sandbox {sandbox.key!r} stored under {key!r}")
        previous = self._by_key.get(key)
        if previous is not None and previous.pool != sandbox.pool:
            self._forget_in_pool(previous)
        self._by_key[key] = sandbox
        self._by_pool.setdefault(sandbox.pool, {})[key] = sandbox
        self.shelves.update(sandbox)
        self.lease_keys.update(sandbox)
        self.reserved.update(sandbox)

    def __delitem__(self, key: str) -> None:
        sandbox = self._by_key.pop(key)
        self._forget_in_pool(sandbox)
        self.shelves.remove(sandbox)
        self.lease_keys.remove(key)
        self.reserved.remove(key)

    def _forget_in_pool(self, sandbox: SandboxPod) -> None:
        members = self._by_pool.get(sandbox.pool)
        if members is not None:
            members.pop(sandbox.key, None)
            if not members:
                del self._by_pool[sandbox.pool]

    def clear(self) -> None:
        self._by_key.clear()
        self._by_pool.clear()
        self.shelves.clear()
        self.lease_keys.clear()
        self.reserved.clear()

    def put(self, sandbox: SandboxPod) -> SandboxPod:
        """Store `sandbox` and tell the listeners."""
        self[sandbox.key] = sandbox
        self.notify(sandbox)
        return sandbox

    def notify(self, sandbox: SandboxPod) -> None:
        for listener in self.listeners:
            listener(sandbox)

    def in_pool(self, pool: str | None = None) -> list[SandboxPod]:
        if pool is None:
            return list(self._by_key.values())
        return list(self._by_pool.get(pool, {}).values())


class IndexedReads:
    """The Backend's reads, all answered from the backend's SandboxIndex (`self.index`)."""

    index: SandboxIndex

    def sandboxes(self, pool: str | None = None) -> list[SandboxPod]:
        return self.index.in_pool(pool)

    def sandbox(self, lease_id: str) -> SandboxPod | None:
        return self.index.get(sandbox_key(lease_id))

    def warm(self, pool: str, image_key: str) -> WarmIndex:
        return self.index.shelves.shelf(pool, image_key)

    def leased_with_key(self, holder: str, idempotency_key: str) -> list[SandboxPod]:
        return self.index.lease_keys.find(holder, idempotency_key)

    def take_reserved(self, pool: str, image_key: str, holder: str, run: str, count: int) -> list[SandboxPod]:
        return self.index.reserved.take(pool, image_key, holder, run, count)

    async def refresh_keyed(self, holder: str, idempotency_key: str, pool: str) -> None:
        """Nothing: the index is the truth where one process holds every lease."""

    def subscribe(self, on_change: Callable[[SandboxPod], None]) -> None:
        self.index.listeners.append(on_change)

    def demand(self, pool: str, image_key: str, waiting: int) -> None:
        """Nothing: a cluster's operator sizes pools from their lease rate (see core.autoscale)."""
