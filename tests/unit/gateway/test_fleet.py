"""A fleet gateway with no member serving: every pool is unreachable (503 to retry), not unknown (404)."""

from __future__ import annotations

import asyncio

import pytest

from sandfleet.gateway.fleet import FleetBackend, NoMemberServes
from sandfleet.gateway.routes.errors import problem_for
from sandfleet.kube.config import ApiClient


async def never_connects() -> ApiClient:
    raise AssertionError("no member is started in these tests")


def fleet() -> FleetBackend:
    return FleetBackend("rl", {"m0": never_connects, "m1": never_connects})


def test_with_no_member_serving_a_pool_is_unreachable_not_unknown() -> None:
    backend = fleet()
    for call in (lambda: backend.pool("python"), backend.pools):
        with pytest.raises(NoMemberServes, match="retry shortly"):
            call()
    with pytest.raises(NoMemberServes):
        asyncio.run(backend.prefetch("python", "img", 2, 60))
    assert problem_for(NoMemberServes("none")) == (503, "unavailable")


def test_a_member_that_has_started_serves_its_pools_again() -> None:
    backend = fleet()
    backend.members["m0"].started = True
    assert backend.pools() == []  # it holds none yet: an empty fleet, not an error
    assert backend.pool("python") is None
