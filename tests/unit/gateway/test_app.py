"""The app's lifespan: a server process freezes its started heap; an app built in a test does not."""

from __future__ import annotations

import gc

import pytest

from sandfleet.gateway.app import Runtime, create_app
from sandfleet.gateway.auth import Authenticator
from tests.support.backends import MemoryBackend


async def noop() -> None:
    return None


@pytest.mark.parametrize("freeze_heap", [True, False])
async def test_a_started_server_freezes_what_is_alive_only_when_asked(freeze_heap: bool) -> None:
    gc.unfreeze()
    runtime = Runtime(
        MemoryBackend(),
        Authenticator(static_tokens={}, anonymous_allowed=True),
        ready=lambda: True,
        start=noop,
        stop=noop,
        freeze_heap=freeze_heap,
    )
    app = create_app(runtime)
    try:
        async with app.router.lifespan_context(app):
            assert (gc.get_freeze_count() > 0) is freeze_heap
    finally:
        gc.unfreeze()  # the rest of the test session collects as usual
