"""A fleet gateway with no member serving: every pool is unreachable (503 to retry), not unknown (404).

A member that cannot start yet is stopped and started again until it serves.
"""

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


class StartsOnTheThirdTry:
    """A member's backend whose cluster cannot be reached the first two times."""

    def __init__(self) -> None:
        self.events: list[str] = []

    async def start(self, sync_timeout: float) -> None:
        self.events.append(f"start {sync_timeout}")
        if len(self.events) < 5:  # start, stop, start, stop, start
            raise OSError("connection refused")

    async def stop(self) -> None:
        self.events.append("stop")
        raise RuntimeError("nothing to stop")  # a failed stop does not end the retries


async def test_a_member_that_cannot_start_is_stopped_and_started_again_until_it_serves(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("sandfleet.gateway.fleet.START_RETRY_SECONDS", 0.01)
    backend = fleet()
    member = backend.members["m0"]
    member.backend = StartsOnTheThirdTry()  # type: ignore[assignment]
    await backend._start_member(member, 7.0)
    assert member.backend.events == ["start 7.0", "stop", "start 7.0", "stop", "start 7.0"]  # type: ignore[attr-defined]
    assert member.started
    assert backend.synced.is_set()
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "member cluster m0 did not start (connection refused); retrying"
    ] * 2
