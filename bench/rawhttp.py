"""A lean HTTP/1.1 client for load generation: requests written as bytes over keep-alive connections.

httpx spends about 10-20 ms of CPU per request in a burst on this machine (FIELD-NOTES), as much
as the gateway it loads, so a benchmark driven by it measures its own client. This one writes the
request's bytes and reads a Content-Length body, nothing else (about a tenth of the CPU); the
benchmarks report its CPU beside the gateway's and the apiserver's all the same.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any


class Connection:
    """One keep-alive connection to `host:port`; one request at a time."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host = host
        self.port = port
        self.auth = f"Authorization: Bearer {token}\r\n".encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> Connection:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()

    async def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """(status, the decoded JSON body, or None when empty)."""
        assert self._reader is not None
        assert self._writer is not None
        payload = b"" if body is None else json.dumps(body).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            + "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        ).encode()
        self._writer.write(head + self.auth + b"\r\n" + payload)
        header = await self._reader.readuntil(b"\r\n\r\n")
        status = int(header[9:12])
        length = 0
        for line in header.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
            elif name.strip().lower() == b"transfer-encoding":
                raise ValueError("a chunked answer: this client reads Content-Length bodies only")
        data = await self._reader.readexactly(length) if length else b""
        return status, json.loads(data) if data else None


async def connections(url: str, token: str, count: int) -> list[Connection]:
    """`count` open connections to `url` (http://host:port)."""
    host, _, port = url.removeprefix("http://").partition(":")
    return list(await asyncio.gather(*(Connection(host, int(port), token).open() for _ in range(count))))
