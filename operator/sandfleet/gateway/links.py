"""OpenAPI links: how a lease id (and a job id) flow from the responses that create them into later calls.

Clients and generated tests (schemathesis's stateful phase) follow them to chain acquire -> exec,
files, renew -> release, instead of guessing ids that never existed.
"""

from __future__ import annotations

from typing import Any

LEASES = "/v1/leases"
LEASE_ID = "$response.body#/leases/0/id"


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
    acquire = paths.get(LEASES, {}).get("post", {}).get("responses", {}).get("201")
    if acquire is not None:
        acquire["links"] = lease_links
    start_job = paths.get(f"{LEASES}/{{lease_id}}/jobs", {}).get("post", {}).get("responses", {})
    if job_links and start_job:
        start_job.setdefault("201", {"description": "The job started: its status."})["links"] = job_links
    return schema
