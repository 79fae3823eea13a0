"""The HTTP under every call: which gateway and token, one call, and its retries."""

from __future__ import annotations

import os
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from sandfleet.client.errors import RETRYABLE, error_for
from sandfleet.wire import FRESH_KEY_HEADER

DEFAULT_URL = "http://127.0.0.1:8080"


@dataclass(frozen=True)
class Call:
    """One HTTP call, independent of sync or async sending."""

    method: str
    path: str
    json: Any = None
    params: Any = None  # a query string (a wire `...Query`)
    content: bytes | None = None
    retry: bool = False  # only calls that are safe to repeat
    # An acquire whose idempotency key the client made itself: its first try says the key is new
    # (the gateway then skips reading back what an earlier try was answered with; there is none).
    fresh_key: bool = False


class TokenFile(httpx.Auth):
    """A bearer token read from a file, re-read when the file changes.

    Kubernetes rotates a projected ServiceAccount token in place (the gateway reviews it with
    TokenReview), so a long-running actor or learner must not keep the first one it read.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._seen: tuple[float, str] | None = None

    def token(self) -> str:
        mtime = self.path.stat().st_mtime
        if self._seen is None or self._seen[0] != mtime:
            self._seen = (mtime, self.path.read_text().strip())
        return self._seen[1]

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self.token()}"
        yield request


def http_client(
    url: str | None,
    token: str | None,
    token_file: str | Path | None,
    timeout: float,
    transport: httpx.AsyncBaseTransport | None,
) -> httpx.AsyncClient:
    """A client for the gateway: a token given wins over a token file, arguments over the environment."""
    url = url or os.environ.get("SANDFLEET_URL", DEFAULT_URL)
    if token is None and token_file is None:
        token = os.environ.get("SANDFLEET_TOKEN")
        token_file = None if token else os.environ.get("SANDFLEET_TOKEN_FILE")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    auth = TokenFile(token_file) if token_file and not token else None
    return httpx.AsyncClient(
        base_url=url.rstrip("/"), headers=headers, auth=auth, timeout=timeout, transport=transport
    )


def raise_for(response: httpx.Response) -> None:
    """The typed error of an error response (`errors.error_for`); nothing for a success."""
    if response.status_code < 400:
        return
    try:
        body: object = response.json()
    except ValueError:
        body = {"error": "http_error", "detail": response.text[:500]}
    raise error_for(response.status_code, body)


async def send(http: httpx.AsyncClient, call: Call, retries: int) -> httpx.Response:
    """Send one call; one safe to repeat is retried on transport errors and 503s, backing off."""
    retrying = AsyncRetrying(
        retry=retry_if_exception_type((httpx.TransportError, *RETRYABLE)),
        stop=stop_after_attempt(1 + (retries if call.retry else 0)),
        wait=wait_exponential(multiplier=0.4, max=2.0),  # 0.4 s, 0.8 s, 1.6 s, then 2 s
        reraise=True,
    )
    tries = [0]

    async def once() -> httpx.Response:
        tries[0] += 1
        fresh = call.fresh_key and tries[0] == 1
        response = await http.request(
            call.method,
            call.path,
            json=call.json,
            params=call.params,
            content=call.content,
            headers={FRESH_KEY_HEADER: "true"} if fresh else None,
        )
        raise_for(response)
        return response

    return await retrying(once)
