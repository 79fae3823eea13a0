"""Pools: what each serves and holds now, and pre-warming task images on one."""

from __future__ import annotations

from fastapi import APIRouter

from sandfleet.core import api
from sandfleet.core.model import SandboxPod
from sandfleet.gateway.backend import PoolInfo
from sandfleet.gateway.models import PlaceView, PoolList, PoolView, PrefetchRequest, PrefetchResponse
from sandfleet.gateway.routes.deps import Authed, PartsDep

router = APIRouter(tags=["pools"])


def pool_view(pool: PoolInfo, sandboxes: list[SandboxPod], waiting: int) -> PoolView:
    """A pool as listed: its spec, and how many of its sandboxes are warm and leased, per place and in all."""
    by_place: dict[tuple[str, str], list[SandboxPod]] = {}
    for sandbox in sandboxes:
        by_place.setdefault((sandbox.cluster, sandbox.region), []).append(sandbox)
    places = [
        PlaceView(
            cluster=cluster,
            region=region,
            warm=sum(s.warm for s in found),
            leased=sum(s.state == api.LEASE_LEASED for s in found),
        )
        for (cluster, region), found in sorted(by_place.items())
    ]
    return PoolView(
        name=pool.name,
        regions=list(pool.regions),
        image=pool.image,
        warm=sum(p.warm for p in places),
        leased=sum(p.leased for p in places),
        waiting=waiting,
        default_ttl_seconds=pool.default_ttl_seconds,
        max_ttl_seconds=pool.max_ttl_seconds,
        places=places,
    )


@router.get("/v1/pools")
async def list_pools(who: Authed, shared: PartsDep) -> PoolList:
    backend, service = shared.backend, shared.service
    views = [pool_view(p, backend.sandboxes(p.name), service.waiting(p.name)) for p in backend.pools()]
    return PoolList(pools=views)


@router.post("/v1/prefetch")
async def prefetch(body: PrefetchRequest, who: Authed, shared: PartsDep) -> PrefetchResponse:
    shared.service.pool(body.pool)
    await shared.authenticator.authorize(who, body.pool)
    images = [(item.image, item.count) for item in body.images]
    names = await shared.service.prefetch(body.pool, images, body.ttl_seconds)
    return PrefetchResponse(pool=body.pool, prewarms=names)
