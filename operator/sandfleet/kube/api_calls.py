"""Raw calls on one ApiClient: JSON in, dicts out, errors as KubeError (no generated model classes).

Reads skip the generated models and decode JSON straight into dicts: at 10,000 Pods the models cost
more CPU and memory than the rest of the operator.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from sandfleet.kube.errors import Gone, KubeError

MERGE_PATCH = "application/merge-patch+json"
# A list of the objects' metadata alone (no spec or status): what a freshness check needs.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
APPLY_PATCH = "application/apply-patch+yaml"
# Under the apiserver's default --min-request-timeout jitter window, so the server never cuts us off first.
WATCH_SECONDS = 290
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=30)
LIST_TIMEOUT = aiohttp.ClientTimeout(total=120)
WATCH_TIMEOUT = aiohttp.ClientTimeout(connect=10, sock_connect=10, sock_read=WATCH_SECONDS + 30)

Query = Mapping[str, str | int | bool]


def query_params(query: Query | None) -> list[tuple[str, str]]:
    """Query parameters as the apiserver spells them (booleans lower-case)."""
    return [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in (query or {}).items()]


def error_message(text: str) -> str:
    """The `message` of an apiserver Status body, else the body itself."""
    try:
        decoded = json.loads(text)
    except ValueError:
        return text
    return str(decoded.get("message", text)) if isinstance(decoded, dict) else text


class KubeClient:
    """Thin async calls on one ApiClient; every error status is a KubeError (410 a Gone)."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client

    async def close(self) -> None:
        await self.api_client.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Any = None,
        content_type: str = "application/json",
        deadline: aiohttp.ClientTimeout | None = None,
        accept: str = "application/json",
    ) -> aiohttp.ClientResponse:
        """The open response (the caller releases it); KubeError for any status of 400 or more."""
        response: aiohttp.ClientResponse = await self.api_client.call_api(
            path,
            method,
            query_params=query_params(query),
            header_params={"Content-Type": content_type, "Accept": accept},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=deadline or REQUEST_TIMEOUT,
        )
        if response.status >= 400:
            text = await response.text()
            response.release()
            if response.status == 410:
                raise Gone(error_message(text))
            raise KubeError(response.status, error_message(text))
        return response

    async def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """The decoded body of one call."""
        response = await self.request(method, path, **kwargs)
        try:
            data: dict[str, Any] = json.loads(await response.read())
            return data
        finally:
            response.release()

    async def send(self, method: str, path: str, **kwargs: Any) -> None:
        """One call whose answer is not needed."""
        response = await self.request(method, path, **kwargs)
        response.release()
