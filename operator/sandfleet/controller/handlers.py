"""kopf handlers: each unpacks what kopf hands over and passes it to the Operator; nothing else happens here.

Only event handlers watch pools and pre-warms, so kopf puts no finalizer and writes nothing on them:
deleting a pool never waits for a running operator, and the garbage collector removes its sandboxes
through their owner references.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from sandfleet.controller.pool_workers import Operator
from sandfleet.core import api


def _operator(memo: Any) -> Operator:
    operator: Operator = memo["operator"]
    return operator


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    """Tune kopf for thousands of objects, then start the Operator (watches, leader election)."""
    # Every kopf event post is a write; we post our own, only for what users must know.
    settings.posting.enabled = False
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 290
    settings.watching.client_timeout = 320
    settings.watching.connect_timeout = 10
    settings.watching.reconnect_backoff = 1.0
    settings.batching.worker_limit = 64
    settings.batching.batch_window = 0.05
    settings.batching.idle_timeout = 30.0
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 10
    settings.networking.error_backoffs = [1, 2, 5, 10, 30]
    await _operator(memo).start()


@kopf.on.cleanup()
async def shut_down(memo: Any, **_: Any) -> None:
    """Stop the pool workers and give the leader lease up so another replica takes over at once."""
    await _operator(memo).stop()


@kopf.on.event(api.GROUP, api.VERSION, api.POOL_PLURAL)
async def pool_event(event: kopf.RawEvent, body: kopf.Body, memo: Any, **_: Any) -> None:
    """A SandboxPool appeared, changed or went away."""
    meta = body.get("metadata", {})
    if event.get("type") == "DELETED":
        _operator(memo).remove_pool(meta["namespace"], meta["name"])
    else:
        _operator(memo).upsert_pool(dict(body))


@kopf.on.event(api.GROUP, api.VERSION, api.PREWARM_PLURAL)
async def prewarm_event(event: kopf.RawEvent, body: kopf.Body, memo: Any, **_: Any) -> None:
    """A lookahead: which task images to warm, how many, for how long."""
    meta = body.get("metadata", {})
    if event.get("type") == "DELETED":
        _operator(memo).remove_prewarm(meta["namespace"], meta["name"])
    else:
        _operator(memo).upsert_prewarm(dict(body))
