"""Recycling a sandbox in place: whether an ended episode's sandbox serves its run again, and the probe.

A pool may opt in (`RecyclePolicy`): a sandbox whose episode ended is reset (to the image's golden
state) and serves another episode of the same run, at most `max_episodes` episodes in all and
never once it is `max_seconds` old. A reset counts only when a probe of the reset sandbox matches
the golden sandbox's own probe (`probe_problems`): the same processes, no socket of the episode,
the same writable files. Anything else destroys the sandbox, as a pool without recycling does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# TCP states as /proc/net/tcp writes them (hex): only a listener is a server's standing socket.
TCP_LISTEN = "0A"
# A reserved (reset, waiting for its run's next lease) sandbox idle this long is given up: its run
# has moved on, and it must not hold the runtime's capacity for ever.
RESERVED_IDLE_SECONDS = 60.0


@dataclass(frozen=True)
class RecyclePolicy:
    """A pool's opt-in: the most episodes one sandbox serves, and the oldest it may start one."""

    max_episodes: int
    max_seconds: float

    def __post_init__(self) -> None:
        """At least two episodes (one means no reuse at all) and a positive age bound."""
        if self.max_episodes < 2:
            raise ValueError(
                f"recycling needs max_episodes of at least 2 (got {self.max_episodes}): "
                "one episode per sandbox is what a pool without recycling does"
            )
        if not self.max_seconds > 0:
            raise ValueError(f"recycling needs a positive max_seconds (got {self.max_seconds})")


@dataclass(frozen=True)
class RecycleDecision:
    """Recycle (reset, or once reset: warm again for its run) or destroy, and why."""

    recycle: bool
    reason: str


def recycle_decision(
    policy: RecyclePolicy | None,
    *,
    run: str | None,
    episodes: int,
    born_at: float,
    now: float,
    probe: Sequence[str] | None = None,
) -> RecycleDecision:
    """Whether a sandbox that has served `episodes` episodes, the last of `run`, is recycled now.

    Asked twice: when the episode ends (`probe` None: reset it or destroy it), and after the
    reset (`probe` the problems its probe found, empty when clean: warm it for its run or destroy
    it). `born_at` is when the sandbox first became warm.
    """
    if policy is None:
        return RecycleDecision(False, "the pool does not recycle")
    if not run:
        return RecycleDecision(False, "the lease had no run label: only a run's own episodes reuse a sandbox")
    if episodes >= policy.max_episodes:
        return RecycleDecision(
            False, f"it served {episodes} episodes, the pool's most ({policy.max_episodes})"
        )
    age = now - born_at
    if age >= policy.max_seconds:
        return RecycleDecision(False, f"it is {age:.0f} s old, past the pool's {policy.max_seconds:g} s")
    if probe:
        return RecycleDecision(False, "its reset did not restore the golden state: " + "; ".join(probe))
    if probe is None:
        return RecycleDecision(True, "reset it for its run's next episode")
    return RecycleDecision(True, "reset and probed clean: warm for its run")


def reserved_to_drop(
    reserved: Mapping[str, tuple[float, float]],
    policy: RecyclePolicy,
    now: float,
    idle_seconds: float = RESERVED_IDLE_SECONDS,
) -> list[str]:
    """The reserved sandboxes (id -> (born at, reserved since)) to destroy: too old, or idle too long."""
    return sorted(
        key
        for key, (born_at, since) in reserved.items()
        if now - born_at >= policy.max_seconds or now - since > idle_seconds
    )


@dataclass(frozen=True)
class Fingerprint:
    """What a sandbox's agent saw inside it: processes, sockets, and digests of its writable roots."""

    processes: frozenset[tuple[int, int, str]]  # (pid, uid, command line)
    # (protocol, local port, remote port, TCP state or "" for UDP); unix sockets as (path, 0, 0, "")
    sockets: frozenset[tuple[str, int, int, str]]
    files: Mapping[str, str]  # writable root -> digest of everything under it ("absent" if none)


def fingerprint_from_json(data: Any) -> Fingerprint:
    """A Fingerprint from the agent's /v1/probe answer; ValueError saying what is malformed."""
    if not isinstance(data, dict):
        raise ValueError("the probe answer is not a JSON object")
    try:
        processes = frozenset((int(p["pid"]), int(p["uid"]), str(p["cmdline"])) for p in data["processes"])
        sockets = frozenset(
            (str(s["proto"]), int(s["local_port"]), int(s["remote_port"]), str(s["state"]))
            for s in data["sockets"]
        )
        files = {str(root): str(digest) for root, digest in data["files"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ValueError(f"the probe answer is malformed ({type(error).__name__}: {error})") from None
    return Fingerprint(processes, sockets, files)


def _episode_sockets(
    sockets: frozenset[tuple[str, int, int, str]], agent_port: int
) -> set[tuple[str, int, str]]:
    """Sockets as they matter for a reset: the agent's own connections (its callers) do not count.

    A connection on the agent's port is a caller of the agent (the probe itself among them); a
    TCP connection's ports other than a listener's change with every connection, so listeners are
    compared by port and any other connection is reported as it is.
    """
    kept: set[tuple[str, int, str]] = set()
    for proto, local, remote, state in sockets:
        if proto.startswith("tcp") and local == agent_port and state != TCP_LISTEN:
            continue
        kept.add((proto, local if state in (TCP_LISTEN, "") else remote, state))
    return kept


def probe_problems(golden: Fingerprint, seen: Fingerprint, agent_port: int) -> list[str]:
    """What differs between a reset sandbox's probe and its golden sandbox's; empty means clean."""
    problems: list[str] = []
    extra = sorted(seen.processes - golden.processes)
    missing = sorted(golden.processes - seen.processes)
    if extra:
        problems.append(
            "processes not in the golden sandbox: " + ", ".join(f"{p[0]} {p[2]!r}" for p in extra)
        )
    if missing:
        problems.append("golden processes missing: " + ", ".join(f"{p[0]} {p[2]!r}" for p in missing))
    golden_sockets = _episode_sockets(golden.sockets, agent_port)
    seen_sockets = _episode_sockets(seen.sockets, agent_port)
    if seen_sockets != golden_sockets:
        added = sorted(seen_sockets - golden_sockets)
        gone = sorted(golden_sockets - seen_sockets)
        problems.append(f"sockets differ from the golden sandbox's (extra {added}, missing {gone})")
    for root in sorted(set(golden.files) | set(seen.files)):
        if golden.files.get(root) != seen.files.get(root):
            problems.append(f"{root} differs from the golden sandbox's")
    return problems
