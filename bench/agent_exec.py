"""Benchmark: exec `true` through the agent of one local gVisor sandbox (keep-alive HTTP).

Prints progress, then one JSON object as its last line: the round trip seen by the client, the
part the agent spent spawning and reaping the process, and a 4 KiB file write+read for context.

    .venv/bin/python bench/agent_exec.py            # full: 2,000 execs
    .venv/bin/python bench/agent_exec.py --short    # CI: 300 execs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx
from localbench import log, prepare, samples, summary

from sandfleet.local.runtime import LocalRuntime

NAME = "exec"
TARGET_EXEC_P50_S = 0.010
WARMUP = 20


async def run(count: int) -> dict[str, object]:
    runsc, image, version = await prepare(NAME)
    round_trips: list[float] = []
    in_agent: list[float] = []
    files: list[float] = []
    async with LocalRuntime(image, runsc) as runtime:
        sandbox = await runtime.create()
        async with httpx.AsyncClient(
            base_url=sandbox.url, headers=sandbox.headers, timeout=30, trust_env=False
        ) as client:
            for index in range(WARMUP + count):
                started = time.perf_counter()
                response = await client.post("/v1/exec", json={"argv": ["true"]})
                elapsed = time.perf_counter() - started
                body = response.json()
                assert body["exit_code"] == 0, body
                if index >= WARMUP:
                    round_trips.append(elapsed)
                    in_agent.append(float(body["duration_s"]))
                if (index + 1) % 500 == 0:
                    log(NAME, f"{index + 1 - WARMUP}/{count}")
            payload = b"x" * 4096
            for _ in range(max(count // 10, 20)):
                started = time.perf_counter()
                await client.put("/v1/files", params={"path": "bench.bin"}, content=payload)
                read = await client.get("/v1/files", params={"path": "bench.bin"})
                files.append(time.perf_counter() - started)
                assert read.content == payload
    result: dict[str, object] = {"benchmark": "agent_exec", "execs": count, "runsc": version}
    result.update(summary(round_trips, "exec_true"))
    result.update(summary(in_agent, "exec_true_in_agent"))
    result.update(summary(files, "file_write_read_4k"))
    result["samples_ms"] = {
        "exec true via the agent": samples(round_trips),
        "4 KiB write + read": samples(files),
    }
    result["target_exec_true_p50_s"] = TARGET_EXEC_P50_S
    result["meets_target"] = bool(summary(round_trips, "e")["e_p50_s"] <= TARGET_EXEC_P50_S)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--short", action="store_true", help="small sizes for CI")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(300 if args.short else 2000))))


if __name__ == "__main__":
    main()
