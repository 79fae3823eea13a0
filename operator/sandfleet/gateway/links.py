"""OpenAPI links: how a lease id (and a job id) flow from the responses that create them into later calls.

Clients and generated tests (schemathesis's stateful phase) follow them to chain list pools ->
acquire -> exec, files, renew -> release, instead of guessing pool names and lease ids that never
existed: the acquire link names a pool the gateway listed, so the chain gets a real lease.
"""

from __future__ import annotations

from typing import Any

LEASES = "/v1/leases"
LEASE_ID = "$response.body#/leases/0/id"
POOLS = "/v1/pools"
# A wait long enough for a refill, and below a tester's usual response-time limit (10 s): a chain
# that finds no warm sandbox then moves on instead of blocking the run.
ACQUIRE_FROM_POOLS = {
    "pool": "$response.body#/pools/0/name",
    "count": 1,
    "wait_seconds": 8,
}


def add_links(schema: dict[str, Any]) -> dict[str, Any]:
    """Add the links to a generated OpenAPI document (in place) and return it."""
    paths: dict[str, dict[str, Any]] = schema.get("paths", {})
    lease_links: dict[str, Any] = {}
    job_links: dict[str, Any] = {}
    for path, operations in paths.items():
        for operation in operations.values():
            operation_id = operation.get("operationId")
            if not operation_id or "{lease_id}" not in path:
                continue
            if "{job}" in path:
                job_links[operation_id] = {
                    "operationId": operation_id,
                    "parameters": {
                        "path.lease_id": "$request.path.lease_id",
                        "path.job": "$response.body#/job_id",
                    },
                }
            else:
                lease_links[operation_id] = {
                    "operationId": operation_id,
                    "parameters": {"path.lease_id": LEASE_ID},
                }
    acquire = paths.get(LEASES, {}).get("post", {})
    granted = acquire.get("responses", {}).get("201")
    if granted is not None:
        granted["links"] = lease_links
    pools = paths.get(POOLS, {}).get("get", {}).get("responses", {}).get("200")
    if pools is not None and acquire.get("operationId"):
        pools["links"] = {
            acquire["operationId"]: {
                "operationId": acquire["operationId"],
                "requestBody": ACQUIRE_FROM_POOLS,
                "x-schemathesis": {"merge_body": False},
            }
        }
    start_job = paths.get(f"{LEASES}/{{lease_id}}/jobs", {}).get("post", {}).get("responses", {})
    if job_links and start_job:
        start_job.setdefault("201", {"description": "The job started: its status."})["links"] = job_links
    return schema
