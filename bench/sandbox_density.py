"""Benchmark: many local gVisor sandboxes at once on this host: health, exec latency, memory each.

Prints progress, then one JSON object as its last line. All sandboxes are created (a few at a
time), then every one is exec'd concurrently in rounds; memory per sandbox is read two ways: the
sandboxes' own memory cgroups, and the drop in the host's MemAvailable.

    .venv/bin/python bench/sandbox_density.py            # full: 20 sandboxes, 10 rounds
    .venv/bin/python bench/sandbox_density.py --short    # CI: 8 sandboxes, 5 rounds
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import httpx
from localbench import log, prepare, summary

from sandfleet.local import hoststate
from sandfleet.local.runtime import LocalRuntime, RunscSandbox

NAME = "density"
PARALLEL_CREATES = 4


def mem_available() -> int:
    """The host's MemAvailable in bytes."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def cgroup_memory(sandbox: RunscSandbox) -> int | None:
    """The sandbox's current memory charge on the host (cgroup v1 memory controller)."""
    path = Path("/sys/fs/cgroup/memory") / hoststate.CGROUP_PARENT / sandbox.id / "memory.usage_in_bytes"
    try:
        return int(path.read_text())
    except OSError:
        return None


async def run(count: int, rounds: int) -> dict[str, object]:
    runsc, image, version = await prepare(NAME)
    async with LocalRuntime(image, runsc) as runtime:
        await runtime.destroy(await runtime.create())
        before = await asyncio.to_thread(mem_available)
        gate = asyncio.Semaphore(PARALLEL_CREATES)

        async def create() -> RunscSandbox:
            async with gate:
                return await runtime.create()

        started = time.monotonic()
        sandboxes = await asyncio.gather(*(create() for _ in range(count)))
        create_wall = time.monotonic() - started
        log(NAME, f"{count} sandboxes ready in {create_wall:.1f} s")
        await asyncio.sleep(1)
        after = await asyncio.to_thread(mem_available)
        charged = [value for value in [cgroup_memory(s) for s in sandboxes] if value is not None]

        latencies: list[float] = []
        failures = 0
        limits = httpx.Limits(max_connections=count * 2)
        async with httpx.AsyncClient(timeout=30, trust_env=False, limits=limits) as client:

            async def exec_true(sandbox: RunscSandbox) -> None:
                nonlocal failures
                begun = time.perf_counter()
                try:
                    response = await client.post(
                        f"{sandbox.url}/v1/exec", json={"argv": ["true"]}, headers=sandbox.headers
                    )
                    ok = response.status_code == 200 and response.json()["exit_code"] == 0
                except httpx.HTTPError:
                    ok = False
                latencies.append(time.perf_counter() - begun)
                failures += 0 if ok else 1

            for index in range(rounds):
                await asyncio.gather(*(exec_true(s) for s in sandboxes))
                log(NAME, f"round {index + 1}/{rounds}: {failures} failures so far")
            healthy = 0
            for sandbox in sandboxes:
                ready = await client.get(f"{sandbox.url}/v1/ready")
                healthy += ready.status_code == 200
    result: dict[str, object] = {
        "benchmark": "sandbox_density",
        "sandboxes": count,
        "host_cpus": os.cpu_count(),
        "runsc": version,
        "healthy": healthy,
        "exec_failures": failures,
        "create_all_wall_s": round(create_wall, 3),
        "memory_cgroup_per_sandbox_bytes": int(sum(charged) / len(charged)) if charged else None,
        "memory_available_drop_per_sandbox_bytes": int((before - after) / count),
    }
    result.update(summary(latencies, "concurrent_exec"))
    result["all_healthy"] = healthy == count and failures == 0
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--short", action="store_true", help="small sizes for CI")
    parser.add_argument("--sandboxes", type=int, help="how many sandboxes (default 20, short 8)")
    args = parser.parse_args()
    count = args.sandboxes or (8 if args.short else 20)
    print(json.dumps(asyncio.run(run(count, 5 if args.short else 10))))


if __name__ == "__main__":
    main()
