"""The local runtime: creates and destroys gVisor sandboxes with runsc, one network namespace each.

Each image is unpacked once per digest and shared read-only (a read-only bind mount); a runtime
serves its default image and any it is given with `add_image`. Every sandbox writes to
its own in-memory overlay, runs in its own network namespace with its own address, and is held to
its memory, CPU and process limits by cgroups. Destruction can run off the critical path; on start,
debris from crashed runtimes is removed. A set-up sandbox can be checkpointed into a golden
snapshot, and new sandboxes restored from it instead of booted. A golden snapshot per spec
(`golden`) also serves pools that recycle: a sandbox is restored from it (`create_restored`), and
reset in place by restoring it again (`reset`); each restored agent is rekeyed to its own token and
probed against the golden sandbox before anyone may use it.

Every agent requires its own bearer token, derived from the runtime's fleet key; a sandbox's
stdout and stderr go to a pipe of which the runtime keeps only a bounded tail (nothing a sandbox
writes lands on the host disk), and the pipe's end tells the runtime that a sandbox died.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType

import httpx
from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception_type,
    retry_if_result,
    stop_before_delay,
    wait_fixed,
)

from sandfleet.core.addressing import DEFAULT_SUBNET
from sandfleet.core.agent_tokens import AGENT_TOKEN_ENV, agent_token, new_fleet_key
from sandfleet.core.api import DEFAULT_AGENT_PORT
from sandfleet.core.limits import SandboxLimits
from sandfleet.core.recycle import Fingerprint, fingerprint_from_json, probe_problems
from sandfleet.local import hoststate, locks, network
from sandfleet.local.artifacts import ImageRef, ensure_agent_bundle
from sandfleet.local.commands import CommandError, run_command
from sandfleet.local.errors import ImageConfigError, LocalRuntimeError
from sandfleet.local.image import ImageConfig, ensure_rootfs, read_image_config, read_image_file
from sandfleet.local.injection import (
    MOUNT_POINT,
    BundleLayout,
    ImageUser,
    Injection,
    agent_argv,
    agent_env,
    layout_from_manifest,
    plan_injection,
    resolve_image_user,
)
from sandfleet.local.layers import LayerLimits

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = Path("/run/sandfleet")
READY_POLL_S = 0.005
READY_ATTEMPT_TIMEOUT_S = 1.0
# What the host keeps of a sandbox's stdout/stderr: a tail in memory, for diagnostics only.
OUTPUT_TAIL_BYTES = 64 * 1024
# How fast the host drains that pipe; past it the pipe fills and the sandbox's own writer blocks,
# so a sandbox flooding its stderr spends its own time, not the gateway's.
OUTPUT_DRAIN_BYTES_PER_S = 8 * 1024 * 1024
# What a reset probe compares with the golden sandbox's: every place the sandbox's users (the exec
# and verifier uids) and the agent's files routes can write. The rest of the image is root's and
# read-only to them (a restore brings the whole memory overlay back anyway); /etc and /opt would
# cost most of the probe's time (0.2 s and 0.7 s here, for the agent's own code).
PROBE_ROOTS = (
    "/workspace",
    "/tmp",
    "/var/tmp",
    "/home",
    "/root",
    "/logs",
    "/tests",
    "/solution",
    "/dev",
    "/run",
)


@dataclass(frozen=True)
class SandboxSpec:
    """What a sandbox is created with: limits, extra agent environment, host ports it may reach."""

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    env: Mapping[str, str] = field(default_factory=dict)
    allow_host_ports: tuple[int, ...] = ()
    image: ImageRef | None = None  # the runtime's default image when None (see LocalRuntime.add_image)


@dataclass
class RunscSandbox:
    """A running sandbox whose agent answered."""

    id: str
    slot: int
    address: str
    port: int
    bundle: Path
    limits: SandboxLimits
    timings: dict[str, float] = field(default_factory=dict)
    token: str = field(default="", repr=False)
    image_digest: str = ""  # the manifest digest of the image it booted
    # What the gateway calls it, from which its token is derived: its id, until it is reset or
    # handed a lease's name (each episode has a name, and so a token, of its own).
    name: str = ""

    def __post_init__(self) -> None:
        """A sandbox is called by its id until it is renamed."""
        self.name = self.name or self.id

    @property
    def url(self) -> str:
        """The agent's base URL, on the sandbox's own address."""
        return f"http://{self.address}:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        """What a client of this sandbox's agent must send (its bearer token)."""
        return {"Authorization": f"Bearer {self.token}"}


@dataclass(frozen=True)
class Snapshot:
    """A golden gVisor checkpoint that sandboxes can be restored from (lives until close)."""

    path: Path
    spec: SandboxSpec
    source: str
    seconds: float
    # A restored agent keeps the environment it was checkpointed with, so its token too.
    token: str = field(default="", repr=False)


@dataclass(frozen=True)
class Golden:
    """A golden snapshot of a freshly booted, ready sandbox, with what its probe saw inside it.

    Its agent's token is random and held only here: a restored sandbox wakes with it and is
    rekeyed to its own at once.
    """

    snapshot: Snapshot
    fingerprint: Fingerprint


class ResetFailed(LocalRuntimeError):
    """A restored sandbox did not come back as its golden sandbox was (it has been destroyed)."""

    def __init__(self, sandbox: str, problems: list[str]) -> None:
        super().__init__(f"sandbox {sandbox} failed its reset probe: {'; '.join(problems)}")
        self.problems = problems


def _golden_key(spec: SandboxSpec, image: ImageRef) -> tuple[object, ...]:
    return (image.digest, spec.limits, tuple(sorted(spec.env.items())), spec.allow_host_ports)


def _not_ready(response: httpx.Response) -> bool:
    """An answer to /v1/ready that says to ask again (the agent is up but not ready yet)."""
    return response.status_code != 200


@dataclass(frozen=True)
class _Served:
    """An image this runtime can boot: its config, and where its shared rootfs is mounted."""

    image: ImageRef
    config: ImageConfig
    rootfs: Path
    # How its sandboxes run the injected agent; None for an image that carries its own.
    injection: Injection | None = None


class LocalRuntime:
    """Creates gVisor sandboxes from its images on this host; use as an async context manager."""

    def __init__(
        self,
        image: ImageRef,
        runsc: Path,
        *,
        state_dir: Path = DEFAULT_STATE_DIR,
        subnet: str = DEFAULT_SUBNET,
        agent_port: int = DEFAULT_AGENT_PORT,
        ready_timeout_s: float = 30.0,
        debug_log_dir: Path | None = None,
        fleet_key: bytes | None = None,
        agent_bundle: Path | None = None,
        inject_all: bool = False,
        commands_as_image_user: bool = False,
        image_limits: LayerLimits | None = None,
    ) -> None:
        self.image = image
        self.runsc = runsc
        self.state_dir = state_dir
        self.agent_port = agent_port
        self.ready_timeout_s = ready_timeout_s
        self.debug_log_dir = debug_log_dir
        # The agent bundle injected into images sandfleet did not build: this directory, else
        # sandbox_image/build's (built, or found cached, when the first such image is served).
        # `inject_all` injects it into sandfleet's own images too (to measure what injection costs).
        self.agent_bundle = agent_bundle
        self.inject_all = inject_all
        # Commands run as each image's own User (root when it names none), through the injected
        # agent; such episodes can reach the agent, so the gateway scores them in clean sandboxes.
        self.commands_as_image_user = commands_as_image_user
        # What an image's layers may hold before this host unpacks them (serve's LocalImageSettings).
        self.image_limits = image_limits
        # Only whoever holds this key (this runtime, and the gateway it is given to) can reach agents.
        self.fleet_key = fleet_key or new_fleet_key()
        # Told (on the event loop) of each sandbox that died without being released.
        self.loss_listeners: list[Callable[[RunscSandbox], None]] = []
        self.instance_id = secrets.token_hex(4)
        self.instance_dir = state_dir / "instances" / self.instance_id
        self.runsc_root = self.instance_dir / "runsc"
        self.rootfs = self.instance_dir / "rootfs"
        self.bundle_mount = self.instance_dir / "agent"
        self._bundle_layout: BundleLayout | None = None
        self._bundle_lock = asyncio.Lock()
        self.slots = network.SlotTable(state_dir / "slots", subnet)
        self.sandboxes: dict[str, RunscSandbox] = {}
        self._specs: dict[str, SandboxSpec] = {}
        self.cleanup_report: hoststate.CleanupReport | None = None
        self._served: dict[str, _Served] = {}  # by manifest digest
        self._lock_fd: int | None = None
        self._counter = itertools.count(1)
        self._pending_destroys: set[asyncio.Task[None]] = set()
        self._client: httpx.AsyncClient | None = None
        self._outputs: dict[str, _OutputTail] = {}
        self._expected_exits: set[str] = set()
        self._goldens: dict[tuple[object, ...], Golden] = {}
        self._destroying: dict[str, asyncio.Task[None]] = {}
        self._golden_locks: dict[tuple[object, ...], asyncio.Lock] = {}

    # --- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> LocalRuntime:
        """Start the runtime."""
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        """Destroy every sandbox and remove the runtime's state."""
        await self.close()

    async def start(self) -> None:
        """Claim an instance directory, clean up after crashed runtimes, and share the rootfs."""
        if os.geteuid() != 0:
            raise LocalRuntimeError("the local runtime needs root (runsc, network namespaces, cgroups)")
        self.instance_dir.mkdir(parents=True)
        lock = locks.try_lock(self.instance_dir / "lock")
        if lock is None:
            raise LocalRuntimeError(f"instance directory {self.instance_dir} is locked by another process")
        self._lock_fd = lock
        try:
            await self._prepare()
        except BaseException:
            await self.close()
            raise

    async def _prepare(self) -> None:
        self.cleanup_report = await hoststate.clean_dead_instances(self.runsc, self.state_dir, self.slots)
        if self.cleanup_report.instances:
            log.warning("removed debris of crashed runtimes: %s", self.cleanup_report)
        self.runsc_root.mkdir()
        await self._serve(self.image, self.rootfs)
        await network.install_firewall()
        self._client = httpx.AsyncClient(timeout=READY_ATTEMPT_TIMEOUT_S, trust_env=False)

    async def add_image(self, image: ImageRef) -> None:
        """Serve another image too: unpacked once per digest (cached), mounted read-only like the first."""
        if self._lock_fd is None:
            raise LocalRuntimeError("the runtime is not started")
        if image.digest not in self._served:
            await self._serve(image, self.instance_dir / "images" / image.digest.replace(":", "-"))

    async def _serve(self, image: ImageRef, mountpoint: Path) -> None:
        config = read_image_config(image)
        shared = await ensure_rootfs(image, self.image_limits)
        injected = self.inject_all or self.commands_as_image_user or not config.own_agent
        if injected:
            # runsc makes a bind mount's mount point on the host side, in the read-only root.
            await asyncio.to_thread(_make_mount_point, shared, image)
        await asyncio.to_thread(mountpoint.mkdir, parents=True)
        # One read-only bind mount shared by all sandboxes: nothing in a sandbox can write to it.
        # It also tells `sandbox_image/build prune` that this unpacked root is in use.
        await run_command(["mount", "--bind", str(shared), str(mountpoint)])
        await run_command(["mount", "-o", "remount,bind,ro", str(mountpoint)])
        injection = None
        if injected:
            await self._mount_bundle()
            # The agent's users must be nobody the image knows (read without following its links).
            passwd, group = (read_image_file(shared, name) for name in ("etc/passwd", "etc/group"))
            user = image_user(image, config, shared) if self.commands_as_image_user else None
            try:
                injection = plan_injection(config.env, config.workdir, passwd, group, user)
            except ValueError as error:
                raise LocalRuntimeError(f"image {image.tag}: {error}") from None
        self._served[image.digest] = _Served(image, config, mountpoint, injection)

    async def _mount_bundle(self) -> None:
        """Mount the agent bundle read-only once, for every sandbox of every image that injects it."""
        async with self._bundle_lock:
            if self._bundle_layout is not None:
                return
            source = self.agent_bundle or await ensure_agent_bundle()
            try:
                layout = layout_from_manifest(json.loads((source / "manifest.json").read_text()))
            except (OSError, ValueError) as error:
                raise LocalRuntimeError(f"the agent bundle at {source} is unusable: {error}") from None
            await asyncio.to_thread(self.bundle_mount.mkdir)
            await run_command(["mount", "--bind", str(source), str(self.bundle_mount)])
            await run_command(["mount", "-o", "remount,bind,ro", str(self.bundle_mount)])
            self._bundle_layout = layout

    def _image_of(self, spec: SandboxSpec) -> _Served:
        image = spec.image or self.image
        served = self._served.get(image.digest)
        if served is None:
            raise LocalRuntimeError(f"image {image.tag} ({image.digest}) is not served: add_image it first")
        return served

    async def close(self) -> None:
        """Destroy every sandbox, wait for pending teardowns, and remove the instance's state."""
        for sandbox in list(self.sandboxes.values()):
            self.release(sandbox)
        if self._pending_destroys:
            await asyncio.gather(*self._pending_destroys, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._lock_fd is None:
            return
        report = hoststate.CleanupReport()
        await hoststate.destroy_runsc_root(self.runsc, self.runsc_root, report)
        hoststate.unmount_all(self.instance_dir)
        await hoststate.remove_cgroups_settled(hoststate.container_prefix(self.instance_id))
        shutil.rmtree(self.instance_dir, ignore_errors=True)
        os.close(self._lock_fd)
        self._lock_fd = None

    # --- sandboxes ------------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec | None = None) -> RunscSandbox:
        """Create (boot) a sandbox and return once its agent answers /v1/ready."""
        return await self._start_sandbox(spec or SandboxSpec(), snapshot=None)

    async def restore(self, snapshot: Snapshot) -> RunscSandbox:
        """Start a sandbox from a golden snapshot instead of booting it; same readiness rule.

        Every restored sandbox begins in the identical state the golden one was in (files in its
        overlay, running processes, imported modules), on its own new address.
        """
        if not snapshot.path.is_dir():
            raise LocalRuntimeError(f"snapshot {snapshot.path} does not exist (was its runtime closed?)")
        return await self._start_sandbox(snapshot.spec, snapshot=snapshot)

    async def snapshot(self, sandbox: RunscSandbox, *, keep_running: bool = False) -> Snapshot:
        """Checkpoint a set-up sandbox into a golden snapshot (runsc checkpoint).

        Without `keep_running` the sandbox is consumed (checkpoint stops it) and released.
        """
        if sandbox.id not in self.sandboxes:
            raise LocalRuntimeError(f"sandbox {sandbox.id} is not running in this runtime")
        path = self.instance_dir / "snapshots" / f"{sandbox.id}-{next(self._counter)}"
        path.mkdir(parents=True)
        started = time.monotonic()
        argv = [str(self.runsc), f"--root={self.runsc_root}", "checkpoint", f"--image-path={path}"]
        if keep_running:
            argv.append("--leave-running")
        else:
            self._expected_exits.add(sandbox.id)  # checkpoint stops it: not a loss
        try:
            await run_command([*argv, sandbox.id], timeout_s=300)
        except (CommandError, LocalRuntimeError) as error:
            shutil.rmtree(path, ignore_errors=True)
            raise LocalRuntimeError(f"checkpointing {sandbox.id} failed: {error}") from None
        snapshot = Snapshot(
            path=path,
            spec=self._specs.get(sandbox.id, SandboxSpec()),
            source=sandbox.id,
            seconds=time.monotonic() - started,
            token=sandbox.token,
        )
        if not keep_running:
            self.release(sandbox)
        return snapshot

    async def _start_sandbox(self, spec: SandboxSpec, snapshot: Snapshot | None) -> RunscSandbox:
        if self._lock_fd is None:
            raise LocalRuntimeError("the runtime is not started")
        served = self._image_of(spec)
        started = time.monotonic()
        sandbox_id = f"{hoststate.container_prefix(self.instance_id)}{next(self._counter)}"
        slot = self.slots.claim(self.instance_id)
        addresses = self.slots.addresses(slot)
        bundle = self.instance_dir / "sandboxes" / sandbox_id
        sandbox = RunscSandbox(
            id=sandbox_id,
            slot=slot,
            address=str(addresses.sandbox),
            port=self.agent_port,
            bundle=bundle,
            limits=spec.limits,
            token=_token_for(self.fleet_key, sandbox_id, spec, snapshot),
            image_digest=served.image.digest,
        )
        self.sandboxes[sandbox_id] = sandbox
        self._specs[sandbox_id] = spec
        try:
            timings = await self._launch(sandbox, spec, served, snapshot)
        except BaseException:
            self.release(sandbox)
            raise
        sandbox.timings = {**timings, "total_s": time.monotonic() - started}
        return sandbox

    async def _launch(
        self, sandbox: RunscSandbox, spec: SandboxSpec, served: _Served, snapshot: Snapshot | None
    ) -> dict[str, float]:
        """Give the sandbox its network, start runsc (run or restore) and wait for its agent."""
        started = time.monotonic()
        await network.create_network(sandbox.slot, self.slots.addresses(sandbox.slot))
        if spec.allow_host_ports:
            await network.allow_host_ports(sandbox.slot, spec.allow_host_ports)
        networked = time.monotonic()
        bundle = sandbox.bundle
        bundle.mkdir(parents=True, exist_ok=True)
        (bundle / "config.json").write_text(json.dumps(self._oci_spec(sandbox, spec, served)))
        if snapshot is None:
            await self._runsc_start(sandbox, ["run", "--detach", f"--bundle={bundle}"])
        else:
            restore = ["restore", "--detach", f"--image-path={snapshot.path}", f"--bundle={bundle}"]
            await self._runsc_start(sandbox, restore)
        running = time.monotonic()
        await self._wait_ready(sandbox)
        return {
            "network_s": networked - started,
            ("runsc_restore_s" if snapshot else "runsc_run_s"): running - networked,
            "agent_ready_s": time.monotonic() - running,
        }

    # --- golden snapshots, restored and reset sandboxes -----------------------------------------

    async def golden(self, spec: SandboxSpec | None = None) -> Golden:
        """The golden snapshot of `spec`: taken once, from a freshly booted sandbox that answered ready."""
        spec = spec or SandboxSpec()
        key = _golden_key(spec, self._image_of(spec).image)
        async with self._golden_locks.setdefault(key, asyncio.Lock()):
            known = self._goldens.get(key)
            if known is not None:
                return known
            # A random token nobody else ever learns: not derived from the fleet key, never leased.
            secret = {**spec.env, AGENT_TOKEN_ENV: secrets.token_hex(32)}
            source = await self.create(replace(spec, env=secret))
            try:
                fingerprint = await self.probe(source)
            except BaseException:
                self.release(source)
                raise
            snapshot = await self.snapshot(source)
            golden = Golden(replace(snapshot, spec=spec), fingerprint)
            self._goldens[key] = golden
            log.info("golden snapshot of %s taken in %.2f s", source.id, snapshot.seconds)
            return golden

    def forget_golden(self, golden: Golden) -> None:
        """Drop a golden snapshot that failed to restore; the next `golden` call takes a new one."""
        for key, known in list(self._goldens.items()):
            if known is golden:
                del self._goldens[key]
        shutil.rmtree(golden.snapshot.path, ignore_errors=True)

    async def create_restored(self, spec: SandboxSpec | None = None) -> RunscSandbox:
        """A sandbox restored from `spec`'s golden snapshot, rekeyed to its own token and probed clean."""
        golden = await self.golden(spec)
        try:
            sandbox = await self.restore(golden.snapshot)
        except LocalRuntimeError:
            self.forget_golden(golden)
            raise
        await self._rekey_and_probe(sandbox, golden, sandbox.name)
        return sandbox

    async def reset(self, sandbox: RunscSandbox, golden: Golden, name: str) -> dict[str, float]:
        """Reset a sandbox in place: the same container restored from the golden snapshot again.

        Its processes, sockets and memory overlay (every file it wrote) go with the old sandbox
        process; it comes back on a fresh network namespace (runsc takes a namespace's address
        over, and the host's connections to the old address must never reach the next episode),
        is rekeyed to the token of `name` and must pass the probe. Anything else raises
        LocalRuntimeError (ResetFailed for a probe) with the sandbox already destroyed.
        """
        if self.sandboxes.get(sandbox.id) is not sandbox:
            raise LocalRuntimeError(f"sandbox {sandbox.id} is not running in this runtime")
        started = time.monotonic()
        spec = self._specs.get(sandbox.id, SandboxSpec())
        # Its old process ending is the reset, not a loss: stop listening before killing it.
        output = self._outputs.pop(sandbox.id, None)
        if output is not None:
            output.close()
        old_slot, new_slot = sandbox.slot, self.slots.claim(self.instance_id)
        try:
            root = f"--root={self.runsc_root}"
            await run_command([str(self.runsc), root, "kill", sandbox.id, "KILL"], check=False, timeout_s=30)
            await run_command(
                [str(self.runsc), root, "delete", "--force", sandbox.id], check=False, timeout_s=60
            )
            await network.delete_network(old_slot)
        except BaseException:
            self.slots.free(new_slot)
            self.release(sandbox)
            raise
        self.slots.free(old_slot)
        sandbox.slot, sandbox.address = new_slot, str(self.slots.addresses(new_slot).sandbox)
        sandbox.token, sandbox.name = golden.snapshot.token, sandbox.id
        torn_down = time.monotonic()
        try:
            timings = await self._launch(sandbox, spec, self._image_of(spec), golden.snapshot)
            restored = time.monotonic()
            await self._rekey_and_probe(sandbox, golden, name)
        except BaseException:
            self.release(sandbox)
            raise
        done = time.monotonic()
        sandbox.timings = {
            "teardown_s": torn_down - started,
            **timings,
            "rekey_probe_s": done - restored,
            "total_s": done - started,
        }
        return sandbox.timings

    async def rekey(self, sandbox: RunscSandbox, name: str) -> None:
        """Give the sandbox's agent the token of `name` (its current one stops working)."""
        assert self._client is not None
        token = agent_token(self.fleet_key, name)
        try:
            response = await self._client.post(
                f"{sandbox.url}/v1/rekey", json={"token": token}, headers=sandbox.headers
            )
        except httpx.TransportError as error:
            raise LocalRuntimeError(f"rekeying {sandbox.id} failed: {type(error).__name__}") from None
        if response.status_code != 200:
            raise LocalRuntimeError(
                f"rekeying {sandbox.id} failed: {response.status_code} {response.text[:200]}"
            )
        sandbox.token, sandbox.name = token, name

    async def probe(self, sandbox: RunscSandbox) -> Fingerprint:
        """What the sandbox's agent sees inside it (processes, sockets, writable roots' digests)."""
        assert self._client is not None
        try:
            response = await self._client.post(
                f"{sandbox.url}/v1/probe",
                json={"roots": list(PROBE_ROOTS)},
                headers=sandbox.headers,
                timeout=30,
            )
            if response.status_code != 200:
                raise LocalRuntimeError(f"probing {sandbox.id}: {response.status_code} {response.text[:200]}")
            return fingerprint_from_json(response.json())
        except (httpx.TransportError, ValueError) as error:
            raise LocalRuntimeError(f"probing {sandbox.id} failed: {error}") from None

    async def _rekey_and_probe(self, sandbox: RunscSandbox, golden: Golden, name: str) -> None:
        try:
            await self.rekey(sandbox, name)
            problems = probe_problems(golden.fingerprint, await self.probe(sandbox), self.agent_port)
        except BaseException:
            self.release(sandbox)
            raise
        if problems:
            self.release(sandbox)
            raise ResetFailed(sandbox.id, problems)

    def release(self, sandbox: RunscSandbox) -> asyncio.Task[None]:
        """Destroy a sandbox in the background (teardown stays off the caller's critical path).

        Releasing it again returns the same teardown, or a finished one: never a second teardown,
        which could free a slot (and delete a network) somebody else has claimed since.
        """
        if self.sandboxes.get(sandbox.id) is not sandbox:
            pending = self._destroying.get(sandbox.id)
            if pending is not None:
                return pending
            return asyncio.get_running_loop().create_task(_nothing())
        self.sandboxes.pop(sandbox.id, None)
        self._specs.pop(sandbox.id, None)
        self._expected_exits.add(sandbox.id)
        task = asyncio.get_running_loop().create_task(self._destroy(sandbox), name=f"destroy {sandbox.id}")
        self._pending_destroys.add(task)
        task.add_done_callback(self._pending_destroys.discard)
        self._destroying[sandbox.id] = task
        task.add_done_callback(lambda done: self._destroyed(sandbox.id, done))
        return task

    def _destroyed(self, sandbox_id: str, task: asyncio.Task[None]) -> None:
        if self._destroying.get(sandbox_id) is task:
            del self._destroying[sandbox_id]

    async def destroy(self, sandbox: RunscSandbox) -> None:
        """Destroy a sandbox and wait until everything it held is gone."""
        await self.release(sandbox)

    async def drain(self) -> None:
        """Wait for background teardowns to finish."""
        while self._pending_destroys:
            await asyncio.gather(*list(self._pending_destroys), return_exceptions=True)

    async def _destroy(self, sandbox: RunscSandbox) -> None:
        root = f"--root={self.runsc_root}"
        await run_command([str(self.runsc), root, "kill", sandbox.id, "KILL"], check=False, timeout_s=30)
        await run_command([str(self.runsc), root, "delete", "--force", sandbox.id], check=False, timeout_s=60)
        await network.delete_network(sandbox.slot)
        self.slots.free(sandbox.slot)
        shutil.rmtree(sandbox.bundle, ignore_errors=True)
        output = self._outputs.pop(sandbox.id, None)
        if output is not None:
            output.close()
        self._expected_exits.discard(sandbox.id)

    async def _runsc_start(self, sandbox: RunscSandbox, command: list[str]) -> None:
        argv = [str(self.runsc), *self._runsc_flags(), *command, sandbox.id]
        # The sandbox inherits the pipe's write end as the agent's stdout and stderr: what it
        # writes stays in memory (a bounded tail), never on the host disk.
        read_end, write_end = os.pipe()
        output = _OutputTail(read_end, lambda: self._sandbox_exited(sandbox))
        self._outputs[sandbox.id] = output
        try:
            # Its own session: a Ctrl-C aimed at the process that owns the runtime must not reach
            # the sandbox's processes; the runtime tears them down itself, in order.
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=write_end,
                stderr=write_end,
                start_new_session=True,
            )
        finally:
            os.close(write_end)
        try:
            code = await asyncio.wait_for(proc.wait(), 60)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        if code != 0:
            raise LocalRuntimeError(
                f"runsc {command[0]} {sandbox.id} exited {code}: {self._log_tail(sandbox)}"
            )

    def _runsc_flags(self) -> list[str]:
        flags = [
            f"--root={self.runsc_root}",
            "--network=sandbox",
            # Writes land in sandbox memory (counted against its limit); the shared rootfs is untouched.
            "--overlay2=root:memory",
        ]
        if self.debug_log_dir is not None:
            # runsc's debug logs grow with what the sandbox does, without bound: debugging only.
            flags += ["--debug", f"--debug-log={self.debug_log_dir}/"]
        return flags

    async def _wait_ready(self, sandbox: RunscSandbox) -> None:
        assert self._client is not None
        polling = AsyncRetrying(
            retry=retry_if_exception_type(httpx.TransportError) | retry_if_result(_not_ready),
            wait=wait_fixed(READY_POLL_S),
            stop=stop_before_delay(self.ready_timeout_s),  # no poll starts after the timeout
        )
        try:
            await polling(self._client.get, f"{sandbox.url}/v1/ready")
        except RetryError as gave_up:
            last = gave_up.last_attempt
            error = last.exception()
            problem = type(error).__name__ if error else f"/v1/ready answered {last.result().status_code}"
            raise LocalRuntimeError(
                f"sandbox {sandbox.id} was not ready within {self.ready_timeout_s:.0f} s ({problem}); "
                f"agent log: {self._log_tail(sandbox)}"
            ) from None

    def _log_tail(self, sandbox: RunscSandbox) -> str:
        output = self._outputs.get(sandbox.id)
        if output is None:
            return "(no log)"
        output.pull()  # what runsc wrote just before failing may not have been read yet
        return output.text()[-2000:].strip() or "(empty)"

    def output_tail(self, sandbox: RunscSandbox) -> bytes:
        """The last OUTPUT_TAIL_BYTES the sandbox's agent wrote to stdout and stderr."""
        output = self._outputs.get(sandbox.id)
        return output.tail() if output is not None else b""

    def _sandbox_exited(self, sandbox: RunscSandbox) -> None:
        # Every holder of the pipe's write end (the sandbox and gofer processes) is gone.
        if sandbox.id in self._expected_exits or self.sandboxes.get(sandbox.id) is not sandbox:
            return
        log.warning("sandbox %s died; agent output: %s", sandbox.id, self._log_tail(sandbox))
        for listener in list(self.loss_listeners):
            listener(sandbox)

    def _oci_spec(self, sandbox: RunscSandbox, spec: SandboxSpec, served: _Served) -> dict[str, object]:
        config = served.config
        limits = spec.limits
        quota, period = limits.cpu_quota()
        agent_vars = {key: value for key, value in spec.env.items() if key != AGENT_TOKEN_ENV}
        agent_vars[AGENT_TOKEN_ENV] = sandbox.token
        mounts: list[dict[str, object]] = []
        if served.injection is None:
            uid, gid, argv, cwd = config.uid, config.gid, config.argv, config.workdir
            env = [*config.env, *(f"{key}={value}" for key, value in agent_vars.items())]
        else:
            # The bundle's agent, root inside gVisor (it switches to its users for every command).
            assert self._bundle_layout is not None
            uid, gid, cwd = 0, 0, "/"
            argv = agent_argv(self._bundle_layout, served.injection, self.agent_port)
            env = agent_env(served.injection, agent_vars)
            mounts.append(
                {
                    "destination": MOUNT_POINT,
                    "type": "bind",
                    "source": str(self.bundle_mount),
                    "options": ["rbind", "ro", "nosuid", "nodev"],
                }
            )
        return {
            "ociVersion": "1.0.2",
            "hostname": "sandbox",
            "process": {
                "terminal": False,
                "user": {"uid": uid, "gid": gid},
                "args": argv,
                "env": env,
                "cwd": cwd,
                "noNewPrivileges": True,
                "capabilities": _capabilities(uid),
                "rlimits": [
                    {"type": "RLIMIT_NOFILE", "hard": 65536, "soft": 65536},
                    # gVisor's processes are not host processes, so the host pids cgroup cannot
                    # stop a fork bomb; the sentry enforces RLIMIT_NPROC for a non-root user.
                    {"type": "RLIMIT_NPROC", "hard": limits.pids, "soft": limits.pids},
                ],
            },
            "root": {"path": str(served.rootfs), "readonly": False},
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {
                    "destination": "/dev",
                    "type": "tmpfs",
                    "source": "tmpfs",
                    "options": ["nosuid", "mode=755"],
                },
                {
                    "destination": "/sys",
                    "type": "sysfs",
                    "source": "sysfs",
                    "options": ["nosuid", "noexec", "ro"],
                },
                {
                    "destination": "/tmp",
                    "type": "tmpfs",
                    "source": "tmpfs",
                    "options": ["nosuid", "mode=1777"],
                },
                *mounts,
            ],
            "linux": {
                "namespaces": [
                    {"type": "pid"},
                    {"type": "ipc"},
                    {"type": "uts"},
                    {"type": "mount"},
                    {"type": "network", "path": network.netns_path(sandbox.slot)},
                ],
                "cgroupsPath": f"/{hoststate.CGROUP_PARENT}/{sandbox.id}",
                "resources": {
                    "memory": {"limit": limits.memory_bytes},
                    "cpu": {"quota": quota, "period": period},
                    "pids": {"limit": host_pids_limit(limits.pids)},
                },
            },
        }


def image_user(image: ImageRef, config: ImageConfig, rootfs: Path) -> ImageUser:
    """The image's `User` as its /etc/passwd and /etc/group resolve it; ImageConfigError if they cannot."""
    passwd, group = (read_image_file(rootfs, name) for name in ("etc/passwd", "etc/group"))
    try:
        return resolve_image_user(config.user, passwd, group)
    except ValueError as error:
        raise ImageConfigError(f"image {image.tag}: {error}") from None


def _make_mount_point(rootfs: Path, image: ImageRef) -> None:
    """An empty directory at the bundle's mount point in an unpacked image (its own, if a directory).

    Anything else there (a link, a file) is refused: the image would decide where the bundle lands.
    """
    point = rootfs / MOUNT_POINT.lstrip("/")
    try:
        os.mkdir(point, 0o755)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(point).st_mode):
            raise LocalRuntimeError(
                f"image {image.tag} has a non-directory at {MOUNT_POINT}, where sandfleet mounts its agent"
            ) from None


async def _nothing() -> None:
    """A teardown that has nothing left to do."""


def host_pids_limit(guest_pids: int) -> int:
    """The host pids cgroup limit that backs a guest process limit.

    Guest processes live inside the gVisor sentry; on the host the sandbox needs Go runtime
    threads plus systrap stub processes and threads. A host limit equal to the guest's wedges the
    sentry itself when a fork bomb fills the guest, so the host limit is a generous backstop.
    """
    return 4 * guest_pids + 256


def _token_for(key: bytes, sandbox_id: str, spec: SandboxSpec, snapshot: Snapshot | None) -> str:
    """The agent's token: the snapshot's (a restored agent keeps its env), an explicit one, or derived."""
    if snapshot is not None and snapshot.token:
        return snapshot.token
    return spec.env.get(AGENT_TOKEN_ENV) or agent_token(key, sandbox_id)


class _OutputTail:
    """Drains a sandbox's output pipe on the event loop, keeping only its last OUTPUT_TAIL_BYTES.

    Draining is rate-limited: past OUTPUT_DRAIN_BYTES_PER_S the reader pauses for the rest of the
    second, the pipe fills, and the sandbox's writer waits. End of file means every process
    holding the write end exited: the sandbox is gone.
    """

    def __init__(self, read_end: int, on_eof: Callable[[], None]) -> None:
        self._fd = read_end
        self._on_eof = on_eof
        self._buffer = bytearray()
        self._loop = asyncio.get_running_loop()
        self._window_start = time.monotonic()
        self._window_bytes = 0
        self._resume: asyncio.TimerHandle | None = None
        self._closed = False
        os.set_blocking(read_end, False)
        self._loop.add_reader(read_end, self._read)

    def tail(self) -> bytes:
        """The last OUTPUT_TAIL_BYTES read."""
        return bytes(self._buffer[-OUTPUT_TAIL_BYTES:])

    def text(self) -> str:
        """The tail as text."""
        return self.tail().decode(errors="replace")

    def pull(self) -> None:
        """Read what is in the pipe now, up to one tail's worth (for an error message)."""
        if self._closed:
            return
        with contextlib.suppress(OSError):
            self._keep(os.read(self._fd, OUTPUT_TAIL_BYTES))

    def close(self) -> None:
        """Stop reading and close the pipe."""
        if self._closed:
            return
        self._closed = True
        if self._resume is not None:
            self._resume.cancel()
        self._loop.remove_reader(self._fd)
        os.close(self._fd)

    def _read(self) -> None:
        try:
            chunk = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._loop.remove_reader(self._fd)
            self._on_eof()
            return
        self._keep(chunk)
        now = time.monotonic()
        if now - self._window_start >= 1.0:
            self._window_start, self._window_bytes = now, 0
        self._window_bytes += len(chunk)
        if self._window_bytes >= OUTPUT_DRAIN_BYTES_PER_S:
            self._loop.remove_reader(self._fd)
            self._resume = self._loop.call_later(1.0 - (now - self._window_start), self._continue)

    def _keep(self, chunk: bytes) -> None:
        self._buffer += chunk
        if len(self._buffer) > 2 * OUTPUT_TAIL_BYTES:
            del self._buffer[:-OUTPUT_TAIL_BYTES]

    def _continue(self) -> None:
        self._resume = None
        if not self._closed:
            self._window_start, self._window_bytes = time.monotonic(), 0
            self._loop.add_reader(self._fd, self._read)


def _capabilities(uid: int) -> dict[str, list[str]]:
    # A non-root agent gets no capabilities at all; a root one keeps a container's usual few.
    kept = (
        []
        if uid != 0
        else ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETGID", "CAP_SETUID"]
    )
    return {name: list(kept) for name in ("bounding", "effective", "permitted")}
