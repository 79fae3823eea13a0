"""The async sandbox protocol of rLLM- and slime-style rollouts: exec, read, write, close on one sandbox.

sandbox = await FleetSandbox.create(fleet, pool="python", labels={"run": "r1"})
output, exit_code = await sandbox.exec("pytest -q", timeout=60)
await sandbox.write("/workspace/a.py", "...")
text = await sandbox.read("/workspace/a.py")
await sandbox.close()

sandboxes = await FleetSandbox.create_batch(fleet, pool="python", count=64, min_count=32)
# a step's rollouts, one sandbox each: up to 64, at least 32, within the wait; close each after
"""

from __future__ import annotations

from typing import Any

from sandfleet.client import AsyncFleet, AsyncSandbox


class FleetSandbox:
    """One leased sandbox behind the exec/read/write/close protocol; `close` is idempotent."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self.sandbox = sandbox
        self.closed = False

    @classmethod
    async def create(cls, fleet: AsyncFleet, pool: str, **lease_options: Any) -> FleetSandbox:
        (lease,) = await fleet.acquire(pool, **lease_options)
        return cls(AsyncSandbox(fleet, lease))

    @classmethod
    async def create_batch(
        cls, fleet: AsyncFleet, pool: str, count: int, min_count: int = 1, **lease_options: Any
    ) -> list[FleetSandbox]:
        """A step's sandboxes in one batch acquire: up to `count`, at least `min_count`, in the wait."""
        leases = await fleet.acquire(pool, count=count, min_count=min_count, **lease_options)
        return [cls(AsyncSandbox(fleet, lease)) for lease in leases]

    @property
    def id(self) -> str:
        return self.sandbox.lease.id

    # `timeout` is the protocol's own parameter name; the deadline is enforced in the sandbox.
    async def exec(self, command: str | list[str], timeout: float | None = None) -> tuple[str, int]:  # noqa: ASYNC109
        """Run a command; (stdout and stderr, exit code), with -1 when it timed out or was killed."""
        result = await self.sandbox.exec(command, timeout_s=timeout)
        code = result.exit_code if result.exit_code is not None and not result.timed_out else -1
        return result.stdout + result.stderr, code

    async def read(self, path: str) -> str:
        return (await self.sandbox.read_file(path)).decode(errors="replace")

    async def write(self, path: str, content: str | bytes) -> None:
        await self.sandbox.write_file(path, content)

    async def evaluate(self, **body: Any) -> float:
        """The reward of the sandbox's tests (Harbor convention unless a command is given)."""
        return float((await self.sandbox.evaluate(**body)).get("reward", 0.0))

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self.sandbox.release()

    async def __aenter__(self) -> FleetSandbox:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()
