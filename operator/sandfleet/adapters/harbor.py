"""A Harbor environment backed by a sandfleet lease (`sandfleet.adapters.harbor:SandfleetEnvironment`).

Written against `harbor.environments.base.BaseEnvironment` (harbor 0.26, Python 3.12+). A trial's
environment is one leased gVisor sandbox: `start` leases it (and, for a task with a prebuilt
`docker_image` and a loose `environment/`, Harbor uploads those files into the working area),
`exec` runs commands as the sandbox user, files move as tars through the gateway, and `stop`
releases the lease. Harbor's verifier uploads the task's tests to `/tests`, runs `/tests/test.sh`
as the task's verifier user and reads `/logs/verifier/reward.json` or `reward.txt`: the agent lets
the files routes reach `/tests`, `/solution` and `/logs` (root's, not the episode's), and commands
Harbor wants run as root or as the verifier go through `evaluate`, as the verifier, after every
process of the episode has been ended (`harbor_support.route`). On a pool whose commands run as
root (`serve --local --commands-as-image-user`), found by `id -u` at start, every command is an exec
as root, Harbor's log directories are made at start, files outside the agent's files routes move as
base64 through a root exec, and the verifier must be Harbor's separate one (a fresh lease): the
episode's lease refuses `/tests` (`harbor_support.refuse_tests_in_episode`).
The environment's Dockerfile is not run here: build it first (`sandfleet harbor build`, or
`sandbox_image/build task`) and name the image with the `image` option.

Options (`--ek key=value`, or `kwargs` of the trial's environment config): `pool` (default
"default"), `image`, `url`, `token`, `token_file` (else SANDFLEET_URL / SANDFLEET_TOKEN),
`ttl_seconds`, `labels`.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities

from sandfleet.adapters.harbor_support import (
    OUTSIDE_ROOT_CODE,
    TRANSFER_MAX_BYTES,
    Route,
    exit_code,
    is_separate_verifier,
    log_dirs_command,
    pack_dir,
    read_command,
    refuse_tests_in_episode,
    root_route,
    route,
    runs_as_root,
    unpack_into,
    verifier_output,
    write_command,
)
from sandfleet.client import AsyncFleet, AsyncSandbox, SandboxError

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
        self.root = False  # found at start: does this pool run every command as root?
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
        who = await self._sandbox.exec("id -u", timeout_s=30.0)
        self.root = runs_as_root(who.stdout)
        if self.root:
            # Non-mounted Harbor environments make these themselves; the oracle writes its log there.
            made = await self._sandbox.exec(log_dirs_command(), timeout_s=30.0)
            if made.exit_code != 0:
                raise RuntimeError(f"cannot make Harbor's log directories: {made.stderr.strip()}")
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

    def _outside(self, error: SandboxError) -> bool:
        """Whether a refused transfer may go through a root exec instead (a root pool, a path outside)."""
        return self.root and error.code == OUTSIDE_ROOT_CODE

    async def _root_read(self, path: str, *, directory: bool) -> bytes:
        result = await self.sandbox.exec(
            read_command(path, directory=directory), timeout_s=300.0, max_output_bytes=TRANSFER_MAX_BYTES
        )
        if result.exit_code != 0 or result.stdout_truncated:
            raise RuntimeError(f"cannot read {path} as root: {result.stderr.strip() or 'over 64 MiB'}")
        return base64.b64decode(result.stdout)

    async def _root_write(self, path: str, data: bytes, *, directory: bool) -> None:
        result = await self.sandbox.exec(
            write_command(path, directory=directory), stdin=base64.b64encode(data).decode(), timeout_s=300.0
        )
        if result.exit_code != 0:
            raise RuntimeError(f"cannot write {path} as root: {result.stderr.strip()}")

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        if self.root and not is_separate_verifier(self.session_id):
            refuse_tests_in_episode(target_path)
        data = await asyncio.to_thread(Path(source_path).read_bytes)
        try:
            await self.sandbox.write_file(target_path, data)
        except SandboxError as error:
            if not self._outside(error):
                raise
            await self._root_write(target_path, data, directory=False)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        if self.root and not is_separate_verifier(self.session_id):
            refuse_tests_in_episode(target_dir)
        archive = await asyncio.to_thread(pack_dir, Path(source_dir))
        try:
            await self.sandbox.upload_archive(target_dir, archive)
        except SandboxError as error:
            if not self._outside(error):
                raise
            await self._root_write(target_dir, archive, directory=True)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        try:
            data = await self.sandbox.read_file(source_path)
        except SandboxError as error:
            if not self._outside(error):
                raise
            data = await self._root_read(source_path, directory=False)
        target = Path(target_path)
        await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
        await asyncio.to_thread(target.write_bytes, data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        try:
            archive = await self.sandbox.download_archive(source_dir)
        except SandboxError as error:
            if not self._outside(error):
                raise
            archive = await self._root_read(source_dir, directory=True)
        # The episode's tar, however it came, is unpacked with the data filter: nothing lands outside.
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
        user = self._resolve_user(user)
        if (root_route(user) if self.root else route(user)) is Route.VERIFIER:
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
