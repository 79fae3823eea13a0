"""The tool calls a text agent makes in a leased sandbox and the text it sees back (gym and SkyRL adapters).

Tools: `exec` (a shell command), `read` and `write` (a file under /workspace). What comes back is
text for a language model: printable ASCII, newlines and tabs only (anything else escaped, since the
sandbox's output is the policy's and may hold terminal escapes), cut in the middle to a length limit.
An error the fleet answers becomes the observation (as a shell would show it), except one that ends
the sandbox: that one also ends the episode, marked `infra_error` so a trainer masks it.
"""

from __future__ import annotations

import contextlib
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sandfleet.client import Evaluation, LeaseEnded, Sandbox, SandfleetError
from sandfleet.wire import Outcome

# Every character a text observation may hold: printable ASCII, newline and tab.
OBSERVATION_CHARSET = frozenset(string.printable) - frozenset("\r\x0b\x0c")


@dataclass(frozen=True)
class ToolResult:
    """What one tool call showed the agent, its details, and whether the sandbox is gone."""

    text: str
    info: dict[str, Any] = field(default_factory=dict)
    sandbox_gone: bool = False
    reward: float = 0.0
    scored: bool = False  # an evaluation ran to an outcome (reward and info["outcome"] are its)


def fit_text(text: str, limit: int) -> str:
    """`text` in OBSERVATION_CHARSET (other characters backslash-escaped), at most `limit` characters.

    A longer text keeps its head and tail (where commands print what went wrong) around a marker.
    """
    safe = "".join(
        c if c in OBSERVATION_CHARSET else c.encode("unicode_escape").decode("ascii") for c in text
    )
    if len(safe) <= limit:
        return safe
    marker = f"\n[... cut: {len(safe)} characters in all ...]\n"
    keep = max(limit - len(marker), 0)
    head = keep // 2
    tail = keep - head
    return (safe[:head] + marker + (safe[-tail:] if tail else ""))[:limit]


def run_tool(sandbox: Sandbox, tool: str, args: Mapping[str, Any]) -> ToolResult:
    """Run one of exec/read/write in the sandbox; bad input and fleet errors come back as text."""
    try:
        if tool == "exec":
            result = sandbox.exec(_command(args), timeout_s=args.get("timeout_s"))
            info = {"exit_code": result.exit_code, "timed_out": result.timed_out}
            return ToolResult(result.stdout + result.stderr, info)
        if tool == "read":
            return ToolResult(sandbox.read_file(_text(args, "path")).decode(errors="replace"))
        if tool == "write":
            path = _text(args, "path")
            sandbox.write_file(path, _text(args, "content"))
            return ToolResult(f"wrote {path}")
    except ValueError as error:
        return ToolResult(f"error: {error}", {"error": "bad_tool_call"})
    except SandfleetError as error:
        return _failed(error)
    return ToolResult(f"error: unknown tool {tool!r}: use exec, read or write", {"error": "unknown_tool"})


def submit(sandbox: Sandbox, body: Mapping[str, Any]) -> ToolResult:
    """Evaluate the sandbox (`body`: a patch, the test command); the typed outcome is in `info`.

    An outcome the fleet caused is `infra_error` with `usable` False, never a silent zero.
    """
    try:
        evaluation = sandbox.score(**body)
    except SandfleetError as error:  # a request the agent refused outright (say, a malformed patch field)
        return _failed(error)
    return ToolResult(
        evaluation_text(evaluation), evaluation_info(evaluation), reward=evaluation.reward, scored=True
    )


def release(sandbox: Sandbox) -> None:
    """Release the sandbox's lease; one that already ended (expired, lost) needs nothing more."""
    with contextlib.suppress(LeaseEnded):
        sandbox.release()


def _failed(error: SandfleetError) -> ToolResult:
    gone = error.infrastructure or isinstance(error, LeaseEnded)
    info: dict[str, Any] = {"error": error.code}
    if gone:
        info |= {"outcome": str(Outcome.INFRA_ERROR), "usable": False}
    return ToolResult(f"error: {error.detail}", info, sandbox_gone=gone)


def evaluation_info(evaluation: Evaluation) -> dict[str, Any]:
    """The typed outcome of an evaluation as plain data (no timings: the same episode, the same info)."""
    return {
        "outcome": str(evaluation.outcome),
        "usable": evaluation.usable,
        "counts": dict(evaluation.counts),
        "reason": evaluation.reason,
    }


def evaluation_text(evaluation: Evaluation) -> str:
    """What the tests printed, else why there is no test output."""
    tail = evaluation.raw.get("exec", {}).get("stdout_tail", "") if isinstance(evaluation.raw, dict) else ""
    return str(tail or evaluation.reason or evaluation.outcome)


def _command(args: Mapping[str, Any]) -> str | list[str]:
    command = args.get("command")
    if isinstance(command, list) and command and all(isinstance(part, str) for part in command):
        return command
    return _text(args, "command")


def _text(args: Mapping[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str):
        raise ValueError(f"the tool call needs {key!r} as text")
    return value
