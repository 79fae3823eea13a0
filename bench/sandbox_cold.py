"""Benchmark: a local gVisor sandbox from create to agent ready (cold, and restored), and a warm lease.

Prints progress, then one JSON object as its last line. Cold: each sandbox is created with runsc
in its own network namespace and counted ready when its agent answers /v1/ready (a real exec).
Restored: the same, but started with `runsc restore` from a golden checkpoint of a set-up sandbox.
Warm: a lease from an in-process pool of ready sandboxes, up to the first exec answering.

    .venv/bin/python bench/sandbox_cold.py            # full: 40 cold, 40 restored, 40 warm leases
    .venv/bin/python bench/sandbox_cold.py --short    # CI: 10 of each
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import deque

import httpx
from localbench import log, prepare, samples, summary

from sandfleet.local.pool import WarmPool
from sandfleet.local.runtime import LocalRuntime, RunscSandbox

NAME = "cold"
TARGET_COLD_P50_S = 1.0
TARGET_FIRST_EXEC_P50_S = 0.030


async def run(runs: int) -> dict[str, object]:
    runsc, image, version = await prepare(NAME)
    cold: list[float] = []
    phases: dict[str, list[float]] = {}
    teardown: list[float] = []
    warm_lease: list[float] = []
    first_exec: list[float] = []
    restored: list[float] = []
    restore_phase: list[float] = []
    checkpoint_s = 0.0
    async with LocalRuntime(image, runsc) as runtime:
        await runtime.destroy(await runtime.create())  # first start pays one-off page-cache misses
        for index in range(runs):
            started = time.monotonic()
            sandbox = await runtime.create()
            cold.append(time.monotonic() - started)
            for phase, seconds in sandbox.timings.items():
                phases.setdefault(phase, []).append(seconds)
            started = time.monotonic()
            await runtime.destroy(sandbox)
            teardown.append(time.monotonic() - started)
            if (index + 1) % 10 == 0:
                log(NAME, f"cold {index + 1}/{runs}: last {cold[-1] * 1000:.0f} ms")

        golden = await runtime.create()
        async with httpx.AsyncClient(
            base_url=golden.url, headers=golden.headers, timeout=30, trust_env=False
        ) as agent:
            # A set-up task: a checked-out tree and an interpreter with its modules already imported.
            setup = "mkdir -p repo && seq 1 2000 | sed 's/^/line /' > repo/data.txt"
            await agent.post("/v1/exec", json={"shell": setup})
            await agent.post(
                "/v1/jobs", json={"argv": ["python3", "-c", "import json, email, http.client; input()"]}
            )
        snapshot = await runtime.snapshot(golden)
        checkpoint_s = snapshot.seconds
        for index in range(runs):
            started = time.monotonic()
            sandbox = await runtime.restore(snapshot)
            restored.append(time.monotonic() - started)
            restore_phase.append(sandbox.timings["runsc_restore_s"])
            runtime.release(sandbox)
            await runtime.drain()
            if (index + 1) % 10 == 0:
                log(NAME, f"restore {index + 1}/{runs}: last {restored[-1] * 1000:.0f} ms")

        # As the local backend leases: take a ready sandbox the pool announced; release destroys it.
        ready: deque[RunscSandbox] = deque()
        pool = WarmPool(runtime, size=2, on_ready=ready.append)
        pool.start()
        async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
            for index in range(runs):
                await pool.wait_full()
                started = time.monotonic()
                sandbox = ready.popleft()
                assert pool.take(sandbox)
                leased = time.monotonic()
                response = await client.post(
                    f"{sandbox.url}/v1/exec", json={"argv": ["true"]}, headers=sandbox.headers
                )
                assert response.json()["exit_code"] == 0
                warm_lease.append(leased - started)
                first_exec.append(time.monotonic() - started)
                runtime.release(sandbox)
                if (index + 1) % 10 == 0:
                    log(NAME, f"warm {index + 1}/{runs}: first exec {first_exec[-1] * 1000:.1f} ms")
        await pool.close()
    result: dict[str, object] = {"benchmark": "sandbox_cold", "runs": runs, "runsc": version}
    result.update(summary(cold, "cold_ready"))
    result.update({f"phase_{name}_p50_s": summary(values, "x")["x_p50_s"] for name, values in phases.items()})
    result.update(summary(teardown, "teardown"))
    result.update(summary(restored, "restore_ready"))
    result.update(summary(restore_phase, "runsc_restore"))
    result["checkpoint_s"] = round(checkpoint_s, 6)
    result.update(summary(warm_lease, "warm_lease"))
    result.update(summary(first_exec, "warm_first_exec"))
    # Raw distributions (ms, sorted) for the report's plots.
    result["samples_ms"] = {
        "cold create to agent ready": samples(cold),
        "restored to agent ready": samples(restored),
        "warm lease to first exec": samples(first_exec),
    }
    result["target_cold_ready_p50_s"] = TARGET_COLD_P50_S
    result["meets_cold_target"] = bool(summary(cold, "c")["c_p50_s"] <= TARGET_COLD_P50_S)
    result["target_first_exec_p50_s"] = TARGET_FIRST_EXEC_P50_S
    result["meets_first_exec_target"] = bool(summary(first_exec, "f")["f_p50_s"] <= TARGET_FIRST_EXEC_P50_S)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--short", action="store_true", help="small sizes for CI")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(10 if args.short else 40))))


if __name__ == "__main__":
    main()
