"""Runs: their policy versions (published, read) and their loop profile (spans in, the profile out)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from sandfleet.core.profile import Span
from sandfleet.gateway.lease_errors import UnknownName
from sandfleet.gateway.routes.deps import Authed, PartsDep, RunName
from sandfleet.gateway.run_models import (
    PolicyView,
    ProfileView,
    PublishPolicy,
    SpansRequest,
    SpansResponse,
    SpansView,
)
from sandfleet.gateway.run_peers import peer_spans

router = APIRouter(tags=["runs"])
Window = Annotated[float, Query(gt=0, le=86400)]


@router.post("/v1/runs/{run}/policy")
async def publish_policy(run: RunName, body: PublishPolicy, who: Authed, shared: PartsDep) -> PolicyView:
    published = await shared.runs.publish(run, body.version, body.staleness_bound, body.mode, who)
    return PolicyView.of(published)


@router.get("/v1/runs/{run}/policy")
async def get_policy(run: RunName, who: Authed, shared: PartsDep) -> PolicyView:
    await shared.runs.check(run, who)
    policy = await shared.runs.policy(run)
    if policy is None:
        raise UnknownName(f"run {run!r} has no published policy: POST /v1/runs/{run}/policy")
    return PolicyView.of(policy)


@router.post("/v1/runs/{run}/spans")
async def report_spans(run: RunName, body: SpansRequest, who: Authed, shared: PartsDep) -> SpansResponse:
    await shared.runs.claim(run, who)
    spans = [Span(s.phase, s.start, s.end, s.source, s.worker) for s in body.spans]
    return SpansResponse(run=run, recorded=shared.runs.record(run, spans, body.dropped_stale))


@router.get("/v1/runs/{run}/spans")
async def get_spans(run: RunName, who: Authed, shared: PartsDep, window_seconds: Window = 300.0) -> SpansView:
    """The run's spans this gateway replica holds; the profile merges every replica's."""
    await shared.runs.check(run, who)
    return SpansView.of(run, window_seconds, shared.runs.spans(run, window_seconds))


@router.get("/v1/runs/{run}/profile")
async def get_profile(
    run: RunName, request: Request, who: Authed, shared: PartsDep, window_seconds: Window = 300.0
) -> ProfileView:
    await shared.runs.check(run, who)
    # The other replicas' share, asked as this caller (each checks the run's owner itself).
    others, notes = await peer_spans(
        shared.proxy.client, await shared.peers.addresses(), run, window_seconds,
        request.headers.get("authorization"),
    )  # fmt: skip
    found = shared.runs.profile(run, window_seconds, others, notes)
    return ProfileView.of(run, found, await shared.runs.policy(run))
