"""A Harbor environment backed by a sandfleet lease (`sandfleet.adapters.harbor:SandfleetEnvironment`).

Written against `harbor.environments.base.BaseEnvironment` (harbor 0.26, Python 3.12+). A trial's
environment is one leased gVisor sandbox: `start` leases it (and, for a task with a prebuilt
`docker_image` and a loose `environment/`, Harbor uploads those files into the working area),
`exec` runs commands as the sandbox user, files move as tars through the gateway, and `stop`
releases the lease. Harbor's verifier uploads the task's tests to `/tests`, runs `/tests/test.sh`
as the task's verifier user and reads `/logs/verifier/reward.json` or `reward.txt`: the agent lets
the files routes reach `/tests`, `/solution` and `/logs` (root's, not the episode's), and commands
Harbor wants run as root or as the verifier go through `evaluate`, as the verifier, after every
process of the episode has been ended (`harbor_support.route`). The environment's Dockerfile is not
run: build the sandbox image with `sandbox_image/build task` and name it with the `image` option.

Options (`--ek key=value`, or `kwargs` of the trial's environment config): `pool` (default
"default"), `image`, `url`, `token`, `token_file` (else SANDFLEET_URL / SANDFLEET_TOKEN),
`ttl_seconds`, `labels`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities

from sandfleet.adapters.harbor_support import Route, exit_code, pack_dir, route, unpack_into, verifier_output
from sandfleet.client import AsyncFleet, AsyncSandbox

ENVIRONMENT_TYPE = "sandfleet"


class SandfleetEnvironment(BaseEnvironment):  # type: ignore[misc,unused-ignore]  # harbor: Python 3.12 only
    """One Harbor trial environment = one sandfleet lease."""

    def __init__(
        self,
        *args: Any,
        pool: str = "default",
        image: str | None = None,
        url: str | None = None,
        token: str | None = None,
        token_file: str | None = None,
        ttl_seconds: int | None = None,
        labels: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        self.pool, self.image, self.ttl_seconds = pool, image, ttl_seconds
        self.labels = dict(labels or {})
        self._fleet_settings: dict[str, Any] = {"url": url, "token": token, "token_file": token_file}
        self._fleet: AsyncFleet | None = None
        self._sandbox: AsyncSandbox | None = None
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        return ENVIRONMENT_TYPE

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # A sandbox has no egress but the pool's allow-list, so "no-network" is enforced.
        return EnvironmentCapabilities(disable_internet=True)

    def _validate_definition(self) -> None:
        if not Path(self.environment_dir).is_dir():
            raise FileNotFoundError(f"{self.environment_dir} is not a directory (the task's environment/)")

    @property
    def sandbox(self) -> AsyncSandbox:
        """The leased sandbox; a clear error before `start`."""
        if self._sandbox is None:
            raise RuntimeError("the sandfleet environment is not started (call start() first)")
        return self._sandbox

    async def start(self, force_build: bool) -> None:
        self._fleet = AsyncFleet(**self._fleet_settings)
        (lease,) = await self._fleet.acquire(
            self.pool, ttl_seconds=self.ttl_seconds, labels=self.labels or None, image=self.image
        )
        self._sandbox = AsyncSandbox(self._fleet, lease)
        await self._upload_environment_dir_after_start()

    async def stop(self, delete: bool) -> None:
        sandbox, fleet = self._sandbox, self._fleet
        self._sandbox = self._fleet = None
        try:
            if sandbox is not None:
                await sandbox.release()
        finally:
            if fleet is not None:
                await fleet.http.aclose()

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        data = await asyncio.to_thread(Path(source_path).read_bytes)
        await self.sandbox.write_file(target_path, data)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        archive = await asyncio.to_thread(pack_dir, Path(source_dir))
        await self.sandbox.upload_archive(target_dir, archive)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        data = await self.sandbox.read_file(source_path)
        target = Path(target_path)
        await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
        await asyncio.to_thread(target.write_bytes, data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        archive = await self.sandbox.download_archive(source_dir)
        await asyncio.to_thread(unpack_into, archive, Path(target_dir))

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        merged = self._merge_env(env)
        timeout_s = float(timeout_sec) if timeout_sec is not None else None
        if route(self._resolve_user(user)) is Route.VERIFIER:
            body: dict[str, Any] = {"shell": command, "cwd": cwd, "env": merged, "timeout_s": timeout_s}
            report = await self.sandbox.evaluate(**{k: v for k, v in body.items() if v is not None})
            stdout, stderr, code = verifier_output(dict(report.raw))
            return ExecResult(stdout=stdout, stderr=stderr, return_code=code)
        result = await self.sandbox.exec(command, env=merged, cwd=cwd, timeout_s=timeout_s)
        return ExecResult(
            stdout=result.stdout,
            stderr=result.stderr,
            return_code=exit_code(result.exit_code, result.timed_out),
        )
