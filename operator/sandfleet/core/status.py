"""A pool's status from a PoolPlan: counts per region, the /scale fields and the conditions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sandfleet.core.model import IMAGE_PULL_REASONS, PoolSpec
from sandfleet.core.planner import PoolPlan
from sandfleet.core.pods import pool_selector
from sandfleet.core.timestamps import format_time

READY = "Ready"
DEGRADED = "Degraded"
CAPACITY_LIMITED = "CapacityLimited"
# The apiserver's refusal as a condition quotes it: enough for its reason, not a whole webhook's page.
REFUSAL_CHARS = 300


@dataclass(frozen=True)
class Transition:
    """A condition that changed status: worth an Event."""

    type: str
    status: str
    reason: str
    message: str


def conditions(pool: PoolSpec, plan: PoolPlan, now: float) -> list[dict[str, Any]]:
    """The three conditions, without transition times (see `merge_conditions`)."""
    ready_total = plan.ready
    if plan.filled and plan.shortfall == 0:
        ready = ("True", "Filled", f"{ready_total} warm sandboxes, every region at its target")
    else:
        ready = ("False", "Filling", f"{ready_total} of {plan.wanted} warm sandboxes ready")
    failures = plan.failures
    if failures.degraded and failures.refusal:
        degraded = (
            "True",
            "CreatesRefused",
            f"the apiserver refused this pool's sandbox Pods {failures.streak} passes in a row, last: "
            f"{failures.refusal[:REFUSAL_CHARS]}; next attempt at {format_time(failures.next_attempt_at())}. "
            "Check the namespace's ServiceAccount, quotas and admission policies.",
        )
    elif failures.degraded and failures.broken_reason.startswith(IMAGE_PULL_REASONS):
        # The image cannot be had: say so, with the kubelet's words (registry, credentials, name).
        degraded = (
            "True",
            "ImagePullFailed",
            f"{failures.streak} sandboxes in a row could not get their image (template "
            f"{failures.template_hash}), last: {failures.broken_reason[:REFUSAL_CHARS]}; "
            f"next attempt at {format_time(failures.next_attempt_at())}. "
            "Check the image reference, the registry and the pool's imagePullSecrets.",
        )
    elif failures.degraded:
        # An absolute time, not a countdown: the message must not change (and be rewritten) every pass.
        last = f", last: {failures.broken_reason[:REFUSAL_CHARS]}" if failures.broken_reason else ""
        degraded = (
            "True",
            "SandboxesNotReady",
            f"{failures.streak} sandboxes in a row failed or were not Ready within "
            f"{pool.template.readiness_deadline_seconds}s (template {failures.template_hash}{last}); "
            f"replacing one at a time, next attempt at {format_time(failures.next_attempt_at())}. "
            "Check the image, runtimeClassName and node capacity.",
        )
    else:
        degraded = ("False", "Healthy", "sandboxes get Ready")
    if plan.shortfall:
        capacity = (
            "True",
            "NoCapacity",
            f"the regions can take {plan.target} of {plan.wanted} sandboxes; {plan.shortfall} not placed",
        )
    elif plan.short_regions:
        capacity = (
            "True",
            "ShiftedToOtherRegions",
            f"{', '.join(plan.short_regions)} cannot take its share; the rest moved to other regions",
        )
    else:
        capacity = ("False", "Sufficient", "every region can take its share")
    return [
        {"type": kind, "status": s, "reason": r, "message": m, "observedGeneration": pool.generation}
        for kind, (s, r, m) in ((READY, ready), (DEGRADED, degraded), (CAPACITY_LIMITED, capacity))
    ]


def refused_conditions(pool: PoolSpec, reason: str) -> list[dict[str, Any]]:
    """The conditions of a pool the operator refuses to fill (e.g. a RuntimeClass not allowed)."""
    return [
        {"type": kind, "status": s, "reason": "RuntimeClassNotAllowed", "message": reason}
        | {"observedGeneration": pool.generation}
        for kind, s in ((READY, "False"), (DEGRADED, "True"))
    ]


def merge_conditions(
    previous: Sequence[Mapping[str, Any]], current: Sequence[dict[str, Any]], now: float
) -> tuple[list[dict[str, Any]], list[Transition]]:
    """Carry lastTransitionTime over unchanged statuses; report the ones that changed."""
    before = {c.get("type"): c for c in previous}
    merged, transitions = [], []
    for condition in current:
        old = before.get(condition["type"])
        if old is not None and old.get("status") == condition["status"]:
            merged.append(
                {**condition, "lastTransitionTime": old.get("lastTransitionTime") or format_time(now)}
            )
            continue
        merged.append({**condition, "lastTransitionTime": format_time(now)})
        if old is not None or condition["status"] == "True":
            transitions.append(
                Transition(condition["type"], condition["status"], condition["reason"], condition["message"])
            )
    return merged, transitions


def pool_status(pool: PoolSpec, plan: PoolPlan, conditions: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The status subresource body (everything but the conditions' own timing is a pure count)."""
    return {
        "observedGeneration": pool.generation,
        "replicas": plan.ready,
        "selector": pool_selector(pool.name),
        "ready": plan.ready,
        "leased": plan.leased,
        "starting": plan.starting,
        "failed": plan.failed,
        "regionSummary": ", ".join(f"{r.name} {r.ready}/{r.target}" for r in plan.regions),
        "regions": [
            {
                "name": r.name,
                "target": r.target,
                "ready": r.ready,
                "leased": r.leased,
                "starting": r.starting,
                "failed": r.failed,
                "capacity": r.capacity,
                "unscheduled": r.unscheduled,
            }
            for r in plan.regions
        ],
        "conditions": list(conditions),
    }
