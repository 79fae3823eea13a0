"""Benchmark: a local gVisor sandbox reset in place (recycling) against a fresh boot, medians over runs.

Prints progress, then one JSON object as its last line. Boot: `runsc run` to agent ready (what a
pool without recycling pays per episode, plus the old sandbox's teardown). Restore: a new sandbox
restored from the golden checkpoint, rekeyed and probed (how a recycling pool boots). Reset: the
same sandbox after a dirty episode (files written, a background process, a listening socket),
killed and restored from the golden checkpoint in place, rekeyed and probed clean (what a recycling
pool pays per episode). Each reset's probe is compared with the golden sandbox's; a failed one fails
the benchmark.

    .venv/bin/python bench/sandbox_reset.py            # 20 of each
    .venv/bin/python bench/sandbox_reset.py --short    # 5 of each
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import httpx
from localbench import log, prepare, samples, summary

from sandfleet.local.runtime import LocalRuntime

NAME = "reset"
DIRTY = "seq 1 20000 > /workspace/data && echo x > /tmp/x && mkdir -p ~/.cache && touch ~/.cache/y"
LISTENER = "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 9000)); s.listen(); time.sleep(1000)"


async def run(runs: int) -> dict[str, object]:
    runsc, image, version = await prepare(NAME)
    boot: list[float] = []
    teardown: list[float] = []
    restore: list[float] = []
    reset: list[float] = []
    probe: list[float] = []
    phases: dict[str, list[float]] = {}
    async with LocalRuntime(image, runsc) as runtime:
        await runtime.destroy(await runtime.create())  # first start pays one-off page-cache misses
        for index in range(runs):
            started = time.monotonic()
            sandbox = await runtime.create()
            boot.append(time.monotonic() - started)
            started = time.monotonic()
            await runtime.destroy(sandbox)
            teardown.append(time.monotonic() - started)
            log(NAME, f"boot {index + 1}/{runs}: {boot[-1] * 1000:.0f} ms")
        started = time.monotonic()
        golden = await runtime.golden()
        golden_s = time.monotonic() - started
        for index in range(runs):
            started = time.monotonic()
            sandbox = await runtime.create_restored()
            restore.append(time.monotonic() - started)
            await runtime.destroy(sandbox)
            log(NAME, f"restore {index + 1}/{runs}: {restore[-1] * 1000:.0f} ms")
        sandbox = await runtime.create_restored()
        async with httpx.AsyncClient(timeout=60, trust_env=False) as client:
            for index in range(runs):
                headers = sandbox.headers
                dirty = await client.post(f"{sandbox.url}/v1/exec", json={"shell": DIRTY}, headers=headers)
                assert dirty.json()["exit_code"] == 0, dirty.text
                for argv in (["sleep", "1000"], ["python3", "-c", LISTENER]):
                    job = await client.post(f"{sandbox.url}/v1/jobs", json={"argv": argv}, headers=headers)
                    assert job.status_code == 201, job.text
                started = time.monotonic()
                timings = await runtime.reset(sandbox, golden, f"{sandbox.id}-{index}")
                reset.append(time.monotonic() - started)
                for phase, seconds in timings.items():
                    phases.setdefault(phase, []).append(seconds)
                log(NAME, f"reset {index + 1}/{runs}: {reset[-1] * 1000:.0f} ms")
            for _ in range(runs):
                started = time.monotonic()
                await runtime.probe(sandbox)
                probe.append(time.monotonic() - started)
        await runtime.destroy(sandbox)
    result: dict[str, object] = {"benchmark": "sandbox_reset", "runs": runs, "runsc": version}
    result.update(summary(boot, "boot_ready"))
    result.update(summary(teardown, "teardown"))
    result.update(summary(restore, "restored_ready"))
    result.update(summary(reset, "reset"))
    result.update(summary(probe, "probe"))
    result.update({f"reset_phase_{name}_p50_s": round(statistics.median(v), 6) for name, v in phases.items()})
    result["golden_boot_and_checkpoint_s"] = round(golden_s, 6)
    result["reset_over_boot_p50"] = round(statistics.median(reset) / statistics.median(boot), 3)
    result["samples_ms"] = {
        "boot to agent ready": samples(boot),
        "restored from golden, rekeyed, probed": samples(restore),
        "reset in place (teardown, restore, rekey, probe)": samples(reset),
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--short", action="store_true", help="small sizes for CI")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(5 if args.short else 20))))


if __name__ == "__main__":
    main()
