"""schemathesis hooks for the stateful run: acquires ask the existing pool, briefly, so chains get leases."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.hook
def map_body(ctx: Any, body: Any) -> Any:
    # A random pool name is a 404 and a random wait blocks: either way no lease id to follow.
    operation = ctx.operation
    if operation.method.upper() == "POST" and operation.path == "/v1/leases" and isinstance(body, dict):
        body["pool"] = "python"
        body.pop("image", None)
        body.pop("policy_version", None)
        body["count"] = 1
        body.pop("min_count", None)  # a batch's minimum above the count of 1 would be refused
        body["wait_seconds"] = 0.5
        if not isinstance(body.get("ttl_seconds"), int) or not 0 < body["ttl_seconds"] <= 3600:
            body.pop("ttl_seconds", None)
    return body
