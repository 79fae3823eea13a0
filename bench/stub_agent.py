"""A stand-in for the agents of many sandbox Pods: answers every reset clean, and readiness.

For benchmarks of the lease path on simulated nodes, whose Pods have no agent: kwok gives them
loopback addresses (127.1.0.0/16) and this one process, listening on every loopback address at
the Pods' agent port, answers each as its own agent would answer a clean reset (`POST /v1/reset`:
the golden probe and the probe after the reset, equal). It never resets anything: what a real
reset costs and proves is measured by bench/sandbox_reset.py and on the real gVisor node
(bench/recycle_writes.py, tests/e2e/helm). Each reset names its episode; a second reset of an
episode an address is already in is refused like the agent refuses it (409 episode_already_reset).

    .venv/bin/python bench/stub_agent.py --port 28090    # until killed; prints its counts on SIGTERM
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

CLEAN: dict[str, object] = {"processes": [], "sockets": [], "files": {}}
RESET_OK = json.dumps({"episode": 0, "golden": CLEAN, "probe": CLEAN}).encode()
ALREADY = json.dumps(
    {"error": {"code": "episode_already_reset", "message": "already in that episode"}}
).encode()


class Stub:
    def __init__(self) -> None:
        self.episodes: dict[str, int] = {}  # the Pod's address -> the episode it is in
        self.resets = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        address = str(writer.get_extra_info("sockname")[0])
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                status, answer = self.answer(head.split(b" ", 2)[1], body, address)
                writer.write(
                    b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                    % (status, len(answer))
                    + answer
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            return  # stopping with connections open: nothing to report (a traceback per connection)
        finally:
            writer.close()

    def answer(self, path: bytes, body: bytes, address: str) -> tuple[int, bytes]:
        if path != b"/v1/reset":
            return 200, b'{"ready": true}'
        episode = int(json.loads(body or b"{}").get("episode", 0))
        if episode <= self.episodes.get(address, 0):
            return 409, ALREADY
        self.episodes[address] = episode
        self.resets += 1
        return 200, RESET_OK


async def main(port: int) -> None:
    stub = Stub()
    server = await asyncio.start_server(stub.serve, "0.0.0.0", port, backlog=4096)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"stub agent on port {port}", file=sys.stderr, flush=True)
    async with server:
        await stop.wait()
    print(json.dumps({"resets": stub.resets, "addresses": len(stub.episodes)}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(main(parser.parse_args().port))
