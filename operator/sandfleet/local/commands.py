"""Runs host tools (runsc, ip, iptables, umoci) as asyncio subprocesses with timeouts and clear errors."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sandfleet.local.errors import LocalRuntimeError


@dataclass(frozen=True)
class CommandResult:
    """A finished command."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class CommandError(LocalRuntimeError):
    """A host command failed."""

    def __init__(self, result: CommandResult) -> None:
        self.result = result
        detail = (result.stderr or result.stdout).strip()[-2000:]
        super().__init__(f"{' '.join(result.argv)} exited {result.returncode}: {detail}")


async def run_command(
    argv: Sequence[str],
    *,
    timeout_s: float = 60.0,
    check: bool = True,
    input_text: str | None = None,
    env: Mapping[str, str] | None = None,
) -> CommandResult:
    """Run a command to completion; kill it at `timeout_s`; raise CommandError on failure if `check`."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if input_text is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=None if env is None else dict(env),
        )
    except FileNotFoundError:
        raise LocalRuntimeError(f"{argv[0]} is not installed (hack/bootstrap installs it)") from None
    try:
        out, err = await asyncio.wait_for(
            proc.communicate(None if input_text is None else input_text.encode()), timeout_s
        )
    except BaseException as error:
        # Never leave the child running: not on timeout, not when the caller is cancelled.
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        if isinstance(error, TimeoutError):
            raise LocalRuntimeError(f"{' '.join(argv)} did not finish within {timeout_s:.0f} s") from None
        raise
    result = CommandResult(
        argv=tuple(argv),
        returncode=proc.returncode if proc.returncode is not None else -1,
        stdout=out.decode(errors="replace"),
        stderr=err.decode(errors="replace"),
    )
    if check and result.returncode != 0:
        raise CommandError(result)
    return result
