"""The local runtime's pure decisions: boots on demand, prefetch caps, spin-up phases, template hashes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict

from sandfleet.core.limits import SandboxLimits

# The most sandboxes booted on demand at once: beyond it more parallel boots only slow each other.
MAX_PARALLEL_DEMAND_BOOTS = 8
# An on-demand sandbox nobody claimed for this long is surplus: the callers it was booted for were
# served by refills meanwhile (or gave up), and it must not stand as warm beyond the pool's target.
SPARE_IDLE_SECONDS = 10.0


def demand_boots(
    waiting: int, warm: int, booting: int, held: int, capacity: int, parallel: int = MAX_PARALLEL_DEMAND_BOOTS
) -> int:
    """How many sandboxes to boot now for callers waiting on `waiting` sandboxes of one image.

    `warm` are ready for them, `booting` are on their way (warm-pool refills and earlier demand
    boots alike); `held` is everything the runtime holds or is starting, over all images, which
    `capacity` bounds. A group larger than the warm count is served by booting the difference at
    once, rather than waiting for a warm pool that never grows to the group's size.
    """
    short = waiting - warm - booting
    room = capacity - held
    return max(0, min(short, room, parallel - booting))


def idle_spares(
    free_since: Mapping[str, float], now: float, idle_seconds: float = SPARE_IDLE_SECONDS
) -> list[str]:
    """The on-demand sandboxes (key -> free since) unclaimed for longer than `idle_seconds`: retire them."""
    return sorted(key for key, since in free_since.items() if now - since > idle_seconds)


def prefetch_refusal(
    targets: Mapping[str, int], image: str, count: int, leased: int, capacity: int
) -> str | None:
    """Why warming `count` of `image` (beside the other images' warm `targets`) is refused, or None.

    The local runtime holds at most `capacity` sandboxes, warm and leased, over all its images.
    """
    wanted = sum(n for name, n in targets.items() if name != image) + count + leased
    if wanted <= capacity:
        return None
    return (
        f"the local runtime holds at most {capacity} sandboxes; warming {count} of {image!r} beside "
        f"the other images' warm targets and {leased} leased would need {wanted}: prefetch fewer"
    )


def startup_phases(timings: Mapping[str, float]) -> dict[str, float]:
    """A runsc sandbox's timings in the cluster's spin-up phases (the one histogram, by phase).

    scheduled: its network namespace and slot (where a Pod waits for a node); started: runsc run
    or restore (container start); ready: until the agent's exec path answered; total: all of it.
    """
    started = timings.get("runsc_run_s", timings.get("runsc_restore_s", 0.0))
    phases = {
        "scheduled": timings.get("network_s", 0.0),
        "started": started,
        "ready": timings.get("agent_ready_s", 0.0),
        "total": timings.get("total_s", 0.0),
    }
    return {phase: max(0.0, seconds) for phase, seconds in phases.items()}


def template_hash(image_digest: str, limits: SandboxLimits, env: Mapping[str, str]) -> str:
    """A short digest of everything a local sandbox is made from (as a pool template's hash is)."""
    material = {"image": image_digest, "limits": asdict(limits), "env": sorted(env.items())}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:10]
