"""The cluster's record of every sandbox's lease, read the way the operator and the gateway read it.

A Pod of the `pod` store carries its lease itself; a ledger Pod's lease is its entry in its shard's
SandboxLedger. Tests that check what the cluster holds read both, through the product's own pure
readers (`sandbox_from_pod`, `core.ledger.overlay`), never through a gateway's opinion.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, replace
from typing import Any

from sandfleet.core import api
from sandfleet.core.leases import LeaseRecord, lease_metadata, release_metadata, reserve_metadata
from sandfleet.core.ledger import (
    FREE,
    Ledger,
    LedgerEntry,
    ledger_from_object,
    ledger_name,
    ledger_object,
    ledger_patch,
    overlay,
)
from sandfleet.core.model import SandboxPod
from sandfleet.core.pods import sandbox_from_pod
from tests.support.kube import Kubectl


def recorded(
    pods: Iterable[Mapping[str, Any]], ledgers: Iterable[Mapping[str, Any]]
) -> dict[str, SandboxPod]:
    """Pod name -> the sandbox with the lease state the cluster records for it."""
    shards: dict[tuple[str, str], Ledger] = {}
    for obj in ledgers:
        ledger = ledger_from_object(obj)
        shards[(ledger.namespace, ledger.shard)] = ledger
    found: dict[str, SandboxPod] = {}
    for pod in pods:
        sandbox = sandbox_from_pod(pod)
        if sandbox is None:
            continue
        if sandbox.shard is not None:
            shard = shards.get((sandbox.namespace, sandbox.shard))
            sandbox = overlay(sandbox, shard.entries.get(sandbox.name) if shard else None)
        found[sandbox.name] = sandbox
    return found


def read(kube: Kubectl, selector: str = api.POOL_LABEL) -> dict[str, SandboxPod]:
    """`recorded` for the sandbox Pods `selector` picks in kubectl's namespace, read now."""
    pods = kube.json("get", "pods", "-l", selector)["items"]
    ledgers = kube.json("get", api.LEDGER_PLURAL)["items"]
    return recorded(pods, ledgers)


def states(kube: Kubectl, selector: str = api.POOL_LABEL) -> dict[str, str]:
    """Pod name -> its lease state (free, leased, released, reserved, retired)."""
    return {name: sandbox.state for name, sandbox in read(kube, selector).items()}


def leases(kube: Kubectl, selector: str = api.POOL_LABEL) -> dict[str, dict[str, Any]]:
    """Pod name -> its lease record as a dict (leased or released; as the Pod annotation spelled it)."""
    return {name: asdict(s.lease) for name, s in read(kube, selector).items() if s.lease is not None}


# -- writing what a gateway would, to set a scene (a replica that died mid-claim, a reaped lease) ------


def write_lease(kube: Kubectl, pod: str, lease: LeaseRecord) -> None:
    """Record `lease` on sandbox `pod` as a gateway's claim would, in whichever store the Pod uses."""
    if _shard(kube, pod) is None:
        _patch_pod(kube, pod, lease_metadata(lease))
        return
    write_entry(kube, pod, lambda e: LedgerEntry(api.LEASE_LEASED, e.rev + 1, e.episodes, lease))


def write_release(kube: Kubectl, pod: str) -> None:
    """Mark sandbox `pod`'s lease released, as a gateway's release would."""
    if _shard(kube, pod) is None:
        _patch_pod(kube, pod, release_metadata())
        return
    write_entry(kube, pod, lambda e: replace(e, state=api.LEASE_RELEASED, rev=e.rev + 1))


def write_reservation(kube: Kubectl, pod: str, holder: str, run: str, episodes: int) -> None:
    """Record sandbox `pod` as a release after a clean reset leaves it: kept for (holder, run)."""
    now = time.time()
    if _shard(kube, pod) is None:
        _patch_pod(kube, pod, reserve_metadata(holder, run, episodes, now))
        return
    kept = (holder, run)
    write_entry(
        kube, pod, lambda e: LedgerEntry(api.LEASE_RESERVED, e.rev + 1, episodes, None, kept, now, now)
    )


def write_entry(kube: Kubectl, pod: str, change: Callable[[LedgerEntry], LedgerEntry]) -> None:
    """Replace a ledger Pod's entry with `change(entry)` (creating its shard's ledger if need be)."""
    shard = _shard(kube, pod)
    assert shard is not None, f"pod {pod} keeps its lease on itself, not in a ledger"
    found = kube.run("get", api.LEDGER_PLURAL, ledger_name(shard), "-o", "json")
    known = json.loads(found.stdout) if found.returncode == 0 else None
    if known is None:
        kube.apply(ledger_object(kube.namespace or "", shard, {pod: change(FREE)}))
        return
    ledger = ledger_from_object(known)
    entries = {**ledger.entries, pod: change(ledger.entry(pod))}
    patch = ledger_patch(ledger.resource_version, shard, entries)  # conditional, as a gateway writes
    kube("patch", api.LEDGER_PLURAL, ledger_name(shard), "--type=merge", "-p", json.dumps(patch))


def _shard(kube: Kubectl, pod: str) -> str | None:
    labels = kube.json("get", "pod", pod)["metadata"].get("labels") or {}
    shard = labels.get(api.SHARD_LABEL)
    return str(shard) if shard is not None else None


def _patch_pod(kube: Kubectl, pod: str, metadata: dict[str, Any]) -> None:
    kube("patch", "pod", pod, "--type=merge", "-p", json.dumps({"metadata": metadata}))
