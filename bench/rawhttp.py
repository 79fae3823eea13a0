"""A lean HTTP/1.1 client for load generation: requests written as bytes over keep-alive connections.

`burst` fires concurrent single acquires from several processes of it (the benchmarks' burst).

httpx spends about 10-20 ms of CPU per request in a burst on this machine (FIELD-NOTES), as much
as the gateway it loads, so a benchmark driven by it measures its own client. This one writes the
request's bytes and reads a Content-Length body, nothing else (about a tenth of the CPU); the
benchmarks report its CPU beside the gateway's and the apiserver's all the same.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

from sandfleet.wire import FRESH_KEY_HEADER

CLIENT_PROCESSES = 3
# As sandfleet.client sends a key it made itself: the first try says it is new.
FRESH = {FRESH_KEY_HEADER: "true"}


class Connection:
    """One keep-alive connection to `host:port`; one request at a time.

    `source`: the local address to connect from (a loopback address of its own per client
    process, so that many callers are not all one address to the gateway's per-address cap).
    """

    def __init__(self, host: str, port: int, token: str, source: str | None = None) -> None:
        self.host = host
        self.port = port
        self.source = source
        self.auth = f"Authorization: Bearer {token}\r\n".encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> Connection:
        local = (self.source, 0) if self.source else None
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port, local_addr=local)
        return self

    async def reopen(self) -> Connection:
        """A new connection in place of one that failed (the old one closed, whatever its state)."""
        if self._writer is not None:
            self._writer.close()
        return await self.open()

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


async def connections(url: str, token: str, count: int, source: str | None = None) -> list[Connection]:
    """`count` open connections to `url` (http://host:port), from `source` when given."""
    host, _, port = url.removeprefix("http://").partition(":")
    opened = (Connection(host, int(port), token, source).open() for _ in range(count))
    return list(await asyncio.gather(*opened))


def cpu_now() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def burst_process(url: str, token: str, pool: str, count: int, start_at: float, run: str, out: Any) -> None:
    """`count` concurrent acquires from `pool` at one gateway, fired at `start_at`.

    Puts (latencies ms, when each ended, when the first was sent, CPU seconds of the acquires alone,
    the gateway's url).
    """
    cpu = [0.0]
    first_sent = [0.0]

    async def acquire_all() -> tuple[list[float], list[float]]:
        pool_of = await connections(url, token, count)  # open before the burst, as a trainer's would be
        await asyncio.sleep(max(0.0, start_at - time.time()))
        cpu[0], first_sent[0] = cpu_now(), time.time()

        async def one(index: int) -> tuple[float, float]:
            started = time.perf_counter()
            body = {
                "pool": pool,
                "wait_seconds": 60,
                "labels": {"run": run},
                "idempotency_key": f"{run}-{os.getpid()}-{index}",
            }
            status, answer = await pool_of[index].request("POST", "/v1/leases", body, FRESH)
            if status != 201:
                raise RuntimeError(f"acquire failed: {status} {answer}")
            return (time.perf_counter() - started) * 1000, time.time()

        done = await asyncio.gather(*(one(i) for i in range(count)))
        cpu[0] = cpu_now() - cpu[0]
        await asyncio.gather(*(connection.close() for connection in pool_of))
        return [d[0] for d in done], [d[1] for d in done]

    try:
        latencies, ends = asyncio.run(acquire_all())
    except Exception as error:  # the parent says what went wrong instead of waiting for a result
        out.put(f"{url}: {error!r}")
        return
    out.put((latencies, ends, first_sent[0], cpu[0], url))


def in_processes(
    target: Callable[..., None],
    arguments: list[tuple[Any, ...]],
    timeout: float,
    started: Callable[[], None] | None = None,
    answered: Callable[[], None] | None = None,
) -> list[Any]:
    """`target(*args, queue)` in a process of its own for each of `arguments`; what each put.

    Each process puts one result, or a string saying what went wrong: SystemExit names those.
    `started` runs once every process has started, `answered` once the last has put its result.
    """
    queue: multiprocessing.Queue[Any] = multiprocessing.Queue()
    processes = [multiprocessing.Process(target=target, args=(*args, queue)) for args in arguments]
    for process in processes:
        process.start()
    if started is not None:
        started()
    results = [queue.get(timeout=timeout) for _ in processes]
    if answered is not None:
        answered()
    for process in processes:
        process.join(timeout=30)
    failures = [result for result in results if isinstance(result, str)]
    if failures:
        raise SystemExit("; ".join(failures))
    return results


def burst(
    urls: list[str],
    token: str,
    size: int,
    run: str,
    pool: str = "bench",
    on_start: Callable[[], None] | None = None,
    on_end: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """`size` acquires spread evenly over `urls` by CLIENT_PROCESSES client processes.

    The same number whatever the replicas, so the load generator's own parallelism is not what
    differs. `on_start` runs when the clients fire and `on_end` once the last has its answers, so a
    caller can read the servers' CPU over the burst alone (not over the clients' 3 s of connecting,
    which on an otherwise idle cluster doubled the apiserver's CPU per lease). Raises SystemExit
    naming the failures when any acquire fails.
    """
    start_at = time.time() + 3.0  # every client has connected by then (else it starts late, measured)
    shares = [size // CLIENT_PROCESSES + (i < size % CLIENT_PROCESSES) for i in range(CLIENT_PROCESSES)]

    def fire() -> None:
        if on_start is not None:
            time.sleep(max(0.0, start_at - time.time()))
            on_start()

    results = in_processes(
        burst_process,
        [(urls[i % len(urls)], token, pool, share, start_at, run) for i, share in enumerate(shares)],
        timeout=300,
        started=fire,
        answered=on_end,
    )
    latencies = [ms for result in results for ms in result[0]]
    # results arrive in any order; each client's url is its replica (urls[i % len(urls)])
    by_replica: dict[str, list[float]] = {}
    for result in results:
        by_replica.setdefault(result[4], []).extend(result[0])
    replica_p50s = [statistics.median(ms) for ms in by_replica.values()]
    wall = max(end for result in results for end in result[1]) - min(result[2] for result in results)
    return {
        "latencies": latencies,
        "leases_per_s": size / wall,
        "wall_s": wall,
        "client_cpu_s": sum(result[3] for result in results),
        "late_start_s": max(result[2] for result in results) - start_at,
        "replica_p50_spread": max(replica_p50s) / min(replica_p50s),
    }
