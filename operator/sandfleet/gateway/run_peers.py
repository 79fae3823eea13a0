"""A run's spans on the other gateway replicas, so a profile is the run's and not one replica's.

Each replica keeps the spans reported through it (and those it observed) in memory. Behind a
Service, a learner's and each actor's connections land on different replicas, so the replica that
answers `GET /v1/runs/{run}/profile` asks the others for their share (`GET /v1/runs/{run}/spans`)
with the caller's own credentials: each replica authenticates the caller and checks the run's
owner as for any request, and no replica trusts another with more than a caller's rights.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import httpx
from pydantic import ValidationError

from sandfleet.core.pods import ready_replicas, replica_selector
from sandfleet.core.profile import Span
from sandfleet.gateway.run_models import SpansView
from sandfleet.kube.api_calls import KubeClient
from sandfleet.kube.errors import KubeError

log = logging.getLogger(__name__)

# A replica that does not answer within this is left out of the profile (which says so).
PEER_TIMEOUT_S = 5.0
# How long a listing of the replicas is reused: profiles are read by people and dashboards, so
# one list per this period at most, and a new replica is asked within it.
LIST_SECONDS = 5.0


class Peers(Protocol):
    """Where the other replicas of this gateway answer (base URLs); none for a lone gateway."""

    async def addresses(self) -> list[str]: ...


class NoPeers:
    """A gateway alone (serve --local, tests): every span of a run is here."""

    async def addresses(self) -> list[str]:
        return []


class KubePeers:
    """The other Ready Pods of this gateway's Deployment, found through the Kubernetes API.

    The Deployment is told by this replica's own Pod (its name is the hostname): the same
    `app.kubernetes.io` name, instance and component labels, and the same ServiceAccount.
    """

    def __init__(
        self,
        namespace: str,
        kube: Callable[[], KubeClient],
        port: int,
        me: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.namespace = namespace
        self.kube = kube
        self.port = port
        self.me = me or socket.gethostname()
        self.clock = clock
        self._mine: tuple[str, str] | None = None  # (selector, ServiceAccount) of this replica's Pod
        self._listed: tuple[float, list[str]] | None = None
        self._lock = asyncio.Lock()

    async def addresses(self) -> list[str]:
        async with self._lock:  # concurrent profile reads share one listing
            now = self.clock()
            if self._listed is not None and now - self._listed[0] < LIST_SECONDS:
                return self._listed[1]
            try:
                found = await self._list()
            except KubeError as error:
                log.warning("listing the other gateway replicas failed: %s", error)
                found = self._listed[1] if self._listed is not None else []
            self._listed = (now, found)
            return found

    async def _list(self) -> list[str]:
        pods = f"/api/v1/namespaces/{self.namespace}/pods"
        if self._mine is None:
            try:
                own = await self.kube().json("GET", f"{pods}/{self.me}")
            except KubeError as error:
                if error.status != 404:
                    raise
                own = {}  # not in a Pod of this namespace (run from a workstation): alone
            selector = replica_selector(own)
            # Not run by the chart's Deployment: alone as far as we can tell, for good.
            account = str((own.get("spec") or {}).get("serviceAccountName") or "")
            self._mine = (selector or "", account)
            if selector is None:
                log.info("no gateway replicas to gather spans from: %s is no Pod of a Deployment", self.me)
        selector, account = self._mine
        if not selector:
            return []
        listed = await self.kube().json("GET", pods, query={"labelSelector": selector})
        return [
            f"http://{ip}:{self.port}" for ip in ready_replicas(listed.get("items", []), self.me, account)
        ]


async def peer_spans(
    client: httpx.AsyncClient,
    addresses: Sequence[str],
    run: str,
    window_seconds: float,
    authorization: str | None,
) -> tuple[list[Span], list[str]]:
    """The run's spans the other replicas hold, and a note for each replica that gave none."""
    headers = {"authorization": authorization} if authorization else {}

    async def one(address: str) -> list[Span]:
        answer = await client.get(
            f"{address}/v1/runs/{run}/spans",
            params={"window_seconds": window_seconds},
            headers=headers,
            timeout=PEER_TIMEOUT_S,
        )
        answer.raise_for_status()
        view = SpansView.model_validate_json(answer.content)
        return [Span(s.phase, s.start, s.end, s.source, s.worker) for s in view.spans]

    results = await asyncio.gather(*(one(address) for address in addresses), return_exceptions=True)
    spans: list[Span] = []
    missing = 0
    for address, result in zip(addresses, results, strict=True):
        if isinstance(result, list):
            spans.extend(result)
        elif isinstance(result, httpx.HTTPError | ValidationError):
            log.warning("gateway replica %s gave no spans of run %s: %s", address, run, result)
            missing += 1
        else:
            raise result
    notes = []
    if missing:
        notes.append(
            f"{missing} of {len(addresses)} other gateway replicas did not answer: the spans reported "
            "through them are missing from this profile"
        )
    return spans, notes
