"""Runs one command as its user: stdin, capped output, a deadline that ends every process it started."""

from __future__ import annotations

import base64
import codecs
import errno
import os
import selectors
import subprocess
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandfleet_agent import command, reaper, wire
from sandfleet_agent.command import Command
from sandfleet_agent.errors import AgentError, bad_request, unprocessable
from sandfleet_agent.params import (
    optional_float,
    optional_int,
    optional_str,
    optional_str_list,
    optional_str_map,
)
from sandfleet_agent.paths import Workspace
from sandfleet_agent.users import Identity

DEFAULT_TIMEOUT_S = 300.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0
DEFAULT_MAX_OUTPUT_BYTES = 1 << 20
MAX_OUTPUT_BYTES = 256 << 20
# After the command itself exits, output still held open by a backgrounded child (`server &`)
# would otherwise keep the call waiting for that child; read what is there, then return.
ORPHAN_OUTPUT_GRACE_S = 0.25
# Once the group is killed, give the pipes this long to drain before abandoning them.
KILLED_DRAIN_S = 1.0
READ_CHUNK = 64 << 10

OutputSink = Callable[[str, bytes], None]


@dataclass(frozen=True)
class ExecSpec:
    """A validated command: what to run, where, with what, and within which limits."""

    argv: list[str]
    cwd: Path
    env: dict[str, str]
    stdin: bytes
    timeout_s: float | None
    max_output_bytes: int
    encoding: str
    # Who runs it; None runs it as the agent itself (an agent that is not root cannot switch).
    user: Identity | None = None
    # Descriptors the command inherits under their numbers (the scorer's results pipe).
    pass_fds: tuple[int, ...] = ()


@dataclass
class ProcessResult:
    """What happened to one command, filled in as it runs (the client's `ExecResult` is its reply)."""

    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    killed: bool = False
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    pid: int = 0
    start_monotonic: float = 0.0
    duration_s: float = 0.0

    @property
    def stdout_truncated(self) -> bool:
        """Whether stdout produced more than was kept."""
        return self.stdout_bytes > len(self.stdout)

    @property
    def stderr_truncated(self) -> bool:
        """Whether stderr produced more than was kept."""
        return self.stderr_bytes > len(self.stderr)

    def summary(self) -> dict[str, object]:
        """The outcome fields every exec-like response shares (without the output itself)."""
        return {
            "exit_code": self.exit_code,
            "signal": self.signal,
            "timed_out": self.timed_out,
            "killed": self.killed,
            "stdout_bytes": self.stdout_bytes,
            "stderr_bytes": self.stderr_bytes,
            "stdout_truncated": self.stdout_truncated,
            "stderr_truncated": self.stderr_truncated,
            "duration_s": round(self.duration_s, 6),
        }


def parse_exec_spec(
    body: Mapping[str, object],
    workspace: Workspace,
    base_env: Mapping[str, str],
    *,
    default_timeout_s: float | None = DEFAULT_TIMEOUT_S,
    default_max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    user: Identity | None = None,
) -> ExecSpec:
    """Validate an exec request body: exactly one of `argv` or `shell`, plus optional settings."""
    argv = optional_str_list(body, "argv")
    shell = optional_str(body, "shell")
    if (argv is None) == (shell is None):
        raise bad_request("give exactly one of 'argv' (a list) or 'shell' (a string)")
    if argv is not None and not argv:
        raise bad_request("'argv' must not be empty")
    if shell is not None:
        argv = ["/bin/sh", "-c", shell]
    assert argv is not None
    cwd = workspace.resolve(optional_str(body, "cwd"))
    if not cwd.is_dir():
        raise unprocessable(f"cwd {workspace.relative(cwd)!r} is not a directory", "bad_cwd")
    env = dict(base_env)
    env.update(optional_str_map(body, "env") or {})
    stdin_text = optional_str(body, "stdin")
    stdin_b64 = optional_str(body, "stdin_base64")
    if stdin_text is not None and stdin_b64 is not None:
        raise bad_request("give at most one of 'stdin' and 'stdin_base64'")
    stdin = stdin_text.encode() if stdin_text is not None else _b64decode(stdin_b64 or "")
    timeout_s = optional_float(body, "timeout_s", minimum=0.001, maximum=MAX_TIMEOUT_S)
    max_output = optional_int(body, "max_output_bytes", minimum=0, maximum=MAX_OUTPUT_BYTES)
    encoding = optional_str(body, "encoding") or "utf-8"
    if encoding not in {"utf-8", "base64"}:
        raise bad_request("'encoding' must be 'utf-8' or 'base64'")
    return ExecSpec(
        argv=argv,
        cwd=cwd,
        env=env,
        stdin=stdin,
        timeout_s=timeout_s if timeout_s is not None else default_timeout_s,
        max_output_bytes=max_output if max_output is not None else default_max_output_bytes,
        encoding=encoding,
        user=user,
    )


def _b64decode(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise bad_request("'stdin_base64' is not valid base64") from None


def tracked_popen(argv: list[str], **options: Any) -> subprocess.Popen[bytes]:
    """Popen, registered with the orphan reaper so it never collects this child behind our back."""
    with reaper.spawning() as register:
        proc: subprocess.Popen[bytes] = subprocess.Popen(argv, **options)
        register(proc.pid)
    return proc


def wait_and_forget(proc: subprocess.Popen[bytes], timeout: float | None = None) -> int:
    """Wait for a tracked child, then let the reaper forget it."""
    code = proc.wait(timeout)
    reaper.forget(proc.pid)
    return code


def spawn(spec: ExecSpec) -> Command:
    """Start the command as its user, marked so that every process it starts can be ended."""
    try:
        return command.start(
            spec.argv,
            cwd=spec.cwd,
            env=spec.env,
            with_stdin=bool(spec.stdin),
            user=spec.user,
            pass_fds=spec.pass_fds,
        )
    except command.SpawnError as error:
        raise _spawn_error(spec, error) from None


def _spawn_error(spec: ExecSpec, error: command.SpawnError) -> AgentError:
    if error.in_cwd:
        return unprocessable(
            f"cannot enter cwd {str(spec.cwd)!r} as the command's user: {os.strerror(error.code)}",
            "bad_cwd",
        )
    if error.code == errno.ENOENT:
        return unprocessable(f"command not found: {spec.argv[0]!r}", wire.COMMAND_NOT_FOUND)
    if error.code in (errno.EACCES, errno.EPERM):
        return unprocessable(f"command is not executable: {spec.argv[0]!r}", wire.COMMAND_NOT_EXECUTABLE)
    if error.code == errno.ENOEXEC:
        return unprocessable(f"not an executable format: {spec.argv[0]!r}", wire.COMMAND_NOT_EXECUTABLE)
    return unprocessable(f"cannot start {spec.argv[0]!r}: {os.strerror(error.code)}", "spawn_failed")


def run(
    spec: ExecSpec,
    sink: OutputSink | None = None,
    *,
    on_start: Callable[[Command], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    into: ProcessResult | None = None,
    lock: AbstractContextManager[object] | None = None,
) -> ProcessResult:
    """Run a command to completion; output goes to the result (capped) and to `sink` if given.

    `sink` sees each chunk as it arrives (only the part within the cap); an exception from it
    (the client went away) kills the process group and propagates. `into` and `lock` let a
    background job expose the result while it is being filled.
    """
    result = into if into is not None else ProcessResult()
    result.start_monotonic = time.monotonic()
    proc = spawn(spec)
    result.pid = proc.pid
    if on_start is not None:
        on_start(proc)
    try:
        _pump(proc, spec, result, sink, should_stop, lock or nullcontext())
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    returncode = proc.wait()
    with lock or nullcontext():
        result.duration_s = time.monotonic() - result.start_monotonic
        if returncode < 0:
            result.signal = -returncode
            result.exit_code = 128 - returncode
        else:
            result.exit_code = returncode
    return result


def _pump(
    proc: Command,
    spec: ExecSpec,
    result: ProcessResult,
    sink: OutputSink | None,
    should_stop: Callable[[], bool] | None,
    lock: AbstractContextManager[object],
) -> None:
    deadline = None if spec.timeout_s is None else result.start_monotonic + spec.timeout_s
    give_up_at: float | None = None
    with selectors.DefaultSelector() as selector:
        assert proc.stdout is not None
        assert proc.stderr is not None
        selector.register(proc.stdout, selectors.EVENT_READ, "stdout")
        selector.register(proc.stderr, selectors.EVENT_READ, "stderr")
        pending_stdin = memoryview(spec.stdin)
        if proc.stdin is not None:
            # A blocking write larger than the pipe's free space would stall until the child
            # reads, while the child may be stalled writing output we are not reading.
            os.set_blocking(proc.stdin.fileno(), False)
            selector.register(proc.stdin, selectors.EVENT_WRITE, "stdin")
        while len(selector.get_map()) > 0:
            now = time.monotonic()
            if give_up_at is not None and now >= give_up_at:
                return
            if deadline is not None and now >= deadline and not result.killed:
                result.timed_out = True
                _kill(proc, result)
                give_up_at = now + KILLED_DRAIN_S
            if should_stop is not None and not result.killed and should_stop():
                _kill(proc, result)
                give_up_at = now + KILLED_DRAIN_S
            if give_up_at is None and proc.poll() is not None:
                give_up_at = now + ORPHAN_OUTPUT_GRACE_S
            wait = 0.05
            if deadline is not None and not result.killed:
                wait = min(wait, max(deadline - now, 0.0))
            for key, _ in selector.select(wait):
                name = key.data
                if name == "stdin":
                    assert proc.stdin is not None
                    try:
                        written = os.write(proc.stdin.fileno(), pending_stdin[:READ_CHUNK])
                    except BlockingIOError:
                        written = 0
                    except BrokenPipeError:
                        written = len(pending_stdin)
                    pending_stdin = pending_stdin[written:]
                    if not pending_stdin:
                        selector.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                chunk = os.read(key.fd, READ_CHUNK)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                with lock:
                    kept = _keep(result, name, chunk, spec.max_output_bytes)
                if sink is not None and kept:
                    sink(name, kept)


def _keep(result: ProcessResult, stream: str, chunk: bytes, cap: int) -> bytes:
    buffer = result.stdout if stream == "stdout" else result.stderr
    if stream == "stdout":
        result.stdout_bytes += len(chunk)
    else:
        result.stderr_bytes += len(chunk)
    room = cap - len(buffer)
    kept = chunk[: max(room, 0)]
    buffer.extend(kept)
    return kept


def _kill(proc: Command, result: ProcessResult) -> None:
    result.killed = True
    proc.kill()


class TextDecoder:
    """Turns a byte stream into text chunks for JSON, without splitting multi-byte characters."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def decode(self, chunk: bytes, *, final: bool = False) -> str:
        """Decode the next chunk (base64 chunks stand alone)."""
        if self.encoding == "base64":
            return base64.b64encode(chunk).decode("ascii")
        return self._utf8.decode(chunk, final)


def render_output(data: bytes | bytearray, encoding: str) -> str:
    """Render captured output as text (invalid UTF-8 replaced) or base64."""
    if encoding == "base64":
        return base64.b64encode(data).decode("ascii")
    return bytes(data).decode("utf-8", errors="replace")
