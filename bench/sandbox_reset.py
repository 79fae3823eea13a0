"""Benchmark: a local gVisor sandbox reset in place (recycling) against a fresh boot, medians over runs.

Prints progress, then one JSON object as its last line. Boot: `runsc run` to agent ready (what a
pool without recycling pays per episode, plus the old sandbox's teardown). Restore: a new sandbox
restored from the golden checkpoint, rekeyed and probed (how a recycling pool boots). Reset: the
same sandbox after a dirty episode (files written, a background process, a listening socket),
killed and restored from the golden checkpoint in place, rekeyed and probed clean (what a recycling
pool pays per episode). Agent reset: what the Kubernetes path would use (no checkpoint through a
kubelet), measured in a local sandbox: the agent's own POST /v1/reset (every process of the
sandbox's users ended, the writable roots copied back from the copy it made at start) and the same
probe. Each reset's probe is compared with the clean sandbox's; a failed one fails the benchmark.

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

from sandfleet.core.recycle import fingerprint_from_json, probe_problems
from sandfleet.local.runtime import LocalRuntime, SandboxSpec

NAME = "reset"
DIRTY = "seq 1 20000 > /workspace/data && echo x > /tmp/x && mkdir -p ~/.cache && touch ~/.cache/y"
AGENT_RESET_ROOTS = [
    "/workspace",
    "/tmp",
    "/var/tmp",
    "/home",
    "/root",
    "/dev/shm",
    "/logs",
    "/tests",
    "/solution",
]
PRISTINE = {"SANDFLEET_AGENT_PRISTINE_DIR": "/var/lib/sandfleet-pristine"}
LISTENER = "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 9000)); s.listen(); time.sleep(1000)"


async def dirty_episode(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> None:
    """What an episode leaves behind: files in the writable roots, a background process, a listener."""
    dirty = await client.post(f"{url}/v1/exec", json={"shell": DIRTY}, headers=headers)
    assert dirty.json()["exit_code"] == 0, dirty.text
    for argv in (["sleep", "1000"], ["python3", "-c", LISTENER]):
        job = await client.post(f"{url}/v1/jobs", json={"argv": argv}, headers=headers)
        assert job.status_code == 201, job.text


async def run(runs: int) -> dict[str, object]:
    runsc, image, version = await prepare(NAME)
    boot: list[float] = []
    teardown: list[float] = []
    restore: list[float] = []
    reset: list[float] = []
    probe: list[float] = []
    agent_reset: list[float] = []
    phases: dict[str, list[float]] = {}
    async with LocalRuntime(image, runsc) as runtime:
        await runtime.destroy(await runtime.create())  # first start pays one-off page-cache misses
        started = time.monotonic()
        golden = await runtime.golden()
        golden_s = time.monotonic() - started
        recycled = await runtime.create_restored()
        pristine = await runtime.create(SandboxSpec(env=PRISTINE))
        roots = {"roots": AGENT_RESET_ROOTS}
        async with httpx.AsyncClient(timeout=60, trust_env=False) as client:
            answer = await client.post(f"{pristine.url}/v1/probe", json=roots, headers=pristine.headers)
            clean = fingerprint_from_json(answer.json())
            # Interleaved, so that each figure of an iteration meets the same load on the shared cores.
            for index in range(runs):
                started = time.monotonic()
                sandbox = await runtime.create()
                boot.append(time.monotonic() - started)
                started = time.monotonic()
                await runtime.destroy(sandbox)
                teardown.append(time.monotonic() - started)

                started = time.monotonic()
                sandbox = await runtime.create_restored()
                restore.append(time.monotonic() - started)
                await runtime.destroy(sandbox)

                await dirty_episode(client, recycled.url, recycled.headers)
                started = time.monotonic()
                timings = await runtime.reset(recycled, golden, f"{recycled.id}-{index}")
                reset.append(time.monotonic() - started)
                for phase, seconds in timings.items():
                    phases.setdefault(phase, []).append(seconds)
                started = time.monotonic()
                await runtime.probe(recycled)
                probe.append(time.monotonic() - started)

                # Each episode's calls carry its number, as the gateway's do: the agent refuses others.
                url, headers = pristine.url, {**pristine.headers, "X-Sandfleet-Episode": str(index)}
                await dirty_episode(client, url, headers)
                started = time.monotonic()
                # One round trip, as the gateway resets a Pod: the reset answers with its own probe.
                answer = await client.post(f"{url}/v1/reset", json={"episode": index + 1}, headers=headers)
                agent_reset.append(time.monotonic() - started)
                assert answer.status_code == 200, answer.text
                seen = fingerprint_from_json(answer.json()["probe"])
                problems = probe_problems(clean, seen, runtime.agent_port)
                problems += probe_problems(
                    fingerprint_from_json(answer.json()["golden"]), seen, runtime.agent_port
                )
                assert not problems, problems
                log(
                    NAME,
                    f"{index + 1}/{runs}: boot {boot[-1] * 1000:.0f} ms, restored {restore[-1] * 1000:.0f}"
                    f" ms, reset {reset[-1] * 1000:.0f} ms, agent reset {agent_reset[-1] * 1000:.0f} ms",
                )
        await runtime.destroy(recycled)
        await runtime.destroy(pristine)
    result: dict[str, object] = {"benchmark": "sandbox_reset", "runs": runs, "runsc": version}
    result.update(summary(boot, "boot_ready"))
    result.update(summary(teardown, "teardown"))
    result.update(summary(restore, "restored_ready"))
    result.update(summary(reset, "reset"))
    result.update(summary(probe, "probe"))
    result.update(summary(agent_reset, "agent_reset"))
    result.update({f"reset_phase_{name}_p50_s": round(statistics.median(v), 6) for name, v in phases.items()})
    result["golden_boot_and_checkpoint_s"] = round(golden_s, 6)
    result["reset_over_boot_p50"] = round(statistics.median(reset) / statistics.median(boot), 3)
    result["reset_over_boot_per_iteration_p50"] = round(
        statistics.median(r / b for r, b in zip(reset, boot, strict=True)), 3
    )
    result["samples_ms"] = {
        "boot to agent ready": samples(boot),
        "restored from golden, rekeyed, probed": samples(restore),
        "reset in place (teardown, restore, rekey, probe)": samples(reset),
        "agent reset and probe (the Kubernetes path)": samples(agent_reset),
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--short", action="store_true", help="small sizes for CI")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(5 if args.short else 20))))


if __name__ == "__main__":
    main()
