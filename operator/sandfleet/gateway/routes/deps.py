"""What every route shares, reached through FastAPI dependencies: the caller, the services, path names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi import Path as PathParam

from sandfleet.gateway.auth import Authenticator, Caller
from sandfleet.gateway.backend import Backend
from sandfleet.gateway.clean_scoring import LostEpisodes
from sandfleet.gateway.leasing import LeaseService
from sandfleet.gateway.metrics import GatewayMetrics
from sandfleet.gateway.proxy import AgentProxy
from sandfleet.gateway.run_peers import NoPeers, Peers
from sandfleet.gateway.runs import RUN_NAME, Runs


@dataclass(frozen=True)
class Parts:
    """One gateway's shared objects, held on `app.state.parts` (per app, so test apps never share)."""

    backend: Backend
    authenticator: Authenticator
    service: LeaseService
    proxy: AgentProxy
    runs: Runs
    metrics: GatewayMetrics
    ready: Callable[[], bool]
    peers: Peers = field(default_factory=NoPeers)  # the other replicas (their share of each run's spans)
    # Leases of pools whose commands run as the image's user that lost their sandbox mid-episode.
    lost: LostEpisodes | None = None


async def parts(request: Request) -> Parts:
    """The parts of the app serving `request`."""
    found: Parts = request.app.state.parts
    return found


PartsDep = Annotated[Parts, Depends(parts)]


async def current_caller(
    request: Request, shared: PartsDep, authorization: Annotated[str | None, Header()] = None
) -> Caller:
    """The authenticated caller of a request (401 before any work when there is none)."""
    known = getattr(request.state, "caller", None)  # the Guard authenticated it before the body
    if isinstance(known, Caller):
        return known
    return await shared.authenticator.authenticate(authorization)


Authed = Annotated[Caller, Depends(current_caller)]
# The agent's job ids are hex; anything else would be spliced into the agent's URL (a control
# character makes it invalid, a '?' or '/' would reach another route): refused here with a 422.
JobId = Annotated[str, PathParam(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
RunName = Annotated[str, PathParam(pattern=RUN_NAME, max_length=63)]
