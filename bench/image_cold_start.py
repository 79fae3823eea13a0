"""Benchmark: an image's cold start on the local runtime by phase (pull, unpack, boot, agent ready).

Each image is pushed to a local registry (Debian's docker-registry on loopback, TLS and basic auth:
tests/support/registry.py) once, then every round, for each image in turn:

    pull     `resolve_image` (what `serve --local --image REF` runs) into an empty store, and a
             plain `skopeo copy` of the same image into an empty directory, alternating which goes first
    unpack   `ensure_rootfs` (sandfleet's checks of every layer, then umoci) into an empty rootfs
             cache, and a plain `umoci raw unpack` of the same image, alternating which goes first
    boot     a sandbox's network and `runsc run` (the `scheduled` and `started` phases of
             sandfleet_sandbox_startup_seconds, from the runtime's own timings)
    ready    until the agent answered its first exec (the histogram's `ready`)

The first sandbox after the unpack is the cold one; `--boots` more give the boot and ready medians
the injection ratio is taken from: each image's boot + ready over sandfleet's own base image's (its
agent in the image) in the same run, and the base image's rootfs with the bundle injected
(`inject_all`) for the injection alone. Images: busybox (tests/support/foreign_images.py), the
base sandbox image, and a 1.1 GB bookworm with a conda-style /opt/conda of PyPI wheels
(`build_conda_image`, built once and cached; minutes the first time).

    .venv/bin/python bench/image_cold_start.py           # full: busybox, base, conda; 3 rounds, 5 boots
    .venv/bin/python bench/image_cold_start.py --short   # CI: busybox and base; 1 round, 2 boots

Prints progress and a table on stderr, then one JSON object as its last stdout line. Needs root.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from localbench import REPO, log, prepare

sys.path.insert(0, str(REPO))

from sandfleet.local.artifacts import ImageRef, ensure_agent_bundle
from sandfleet.local.commands import run_command
from sandfleet.local.image import ensure_rootfs, rootfs_cache
from sandfleet.local.plan import startup_phases
from sandfleet.local.pull import RegistryAccess, resolve_image
from sandfleet.local.runtime import LocalRuntime
from tests.support.foreign_images import build_conda_image, build_foreign_image
from tests.support.registry import LocalRegistry, start_registry

NAME = "image_cold"
BASE = "base"


@dataclass
class Figures:
    """What one image measured, every round (seconds)."""

    size_bytes: int = 0
    unpacked_bytes: int = 0
    pull: list[float] = field(default_factory=list)
    skopeo: list[float] = field(default_factory=list)
    unpack: list[float] = field(default_factory=list)
    umoci: list[float] = field(default_factory=list)
    first_boot: list[float] = field(default_factory=list)
    first_ready: list[float] = field(default_factory=list)
    boot: list[float] = field(default_factory=list)
    ready: list[float] = field(default_factory=list)

    def cold(self) -> float:
        """The median cold start: pull, unpack, the first sandbox's boot and ready."""
        return sum(statistics.median(v) for v in (self.pull, self.unpack, self.first_boot, self.first_ready))


async def timed(step: Callable[[], Awaitable[object]]) -> float:
    started = time.monotonic()
    await step()
    return time.monotonic() - started


def directory_bytes(path: Path) -> int:
    """Bytes of the regular files under `path` (links not followed)."""
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def plain_copy(registry: LocalRegistry, reference: str, target: Path) -> None:
    subprocess.run(
        ["skopeo", "copy", "--quiet", "--src-authfile", str(registry.auth_file), "--src-cert-dir",
         str(registry.cert_dir), f"docker://{reference}", f"oci:{target}:x"],
        check=True,
    )  # fmt: skip


async def sandboxes(
    runtime: LocalRuntime, figures: Figures | None, boots: int, cold: bool
) -> tuple[list[float], list[float]]:
    """Boot (the first one cold, when `cold`) and `boots` more; their boot and ready seconds."""
    boot, ready = [], []
    for index in range(boots + (1 if cold else 0)):
        sandbox = await runtime.create()
        phases = startup_phases(sandbox.timings)
        await runtime.destroy(sandbox)
        if cold and index == 0 and figures is not None:
            figures.first_boot.append(phases["scheduled"] + phases["started"])
            figures.first_ready.append(phases["ready"])
            continue
        boot.append(phases["scheduled"] + phases["started"])
        ready.append(phases["ready"])
    return boot, ready


async def one_round(
    index: int,
    name: str,
    reference: str,
    registry: LocalRegistry,
    figures: Figures,
    injected: Figures | None,
    work: Path,
    runsc: Path,
    bundle: Path,
    boots: int,
) -> None:
    """Pull (both ways), unpack and boot `reference` from nothing; the base image also injected."""
    access = RegistryAccess(auth_file=registry.auth_file, cert_dir=registry.cert_dir)
    here = work / f"{name}-{index}"
    store, plain, cache = here / "store", here / "plain", here / "cache"
    here.mkdir()
    pulled: list[ImageRef] = []

    async def pull() -> None:
        pulled.append(await resolve_image(reference, access, store=store))

    async def copy() -> None:
        await asyncio.to_thread(plain_copy, registry, reference, plain)

    # Alternate which goes first: the second reads the registry's blobs from a warmer page cache.
    if index % 2 == 0:
        figures.pull.append(await timed(pull))
        figures.skopeo.append(await timed(copy))
    else:
        figures.skopeo.append(await timed(copy))
        figures.pull.append(await timed(pull))
    figures.size_bytes = directory_bytes(plain / "blobs")
    shutil.rmtree(plain)
    image = pulled[0]

    async def unpack_plain() -> None:
        argv = ["umoci", "raw", "unpack", "--image", image.layout_ref, str(here / "umoci")]
        await run_command(argv, timeout_s=1800)

    # A rootfs cache of this round's own: the unpack is cold, and the host's cache is untouched.
    os.environ["SANDFLEET_CACHE"] = str(cache)
    try:
        if index % 2 == 0:
            figures.unpack.append(await timed(lambda: ensure_rootfs(image)))
            figures.umoci.append(await timed(unpack_plain))
        else:
            figures.umoci.append(await timed(unpack_plain))
            figures.unpack.append(await timed(lambda: ensure_rootfs(image)))
        await asyncio.to_thread(shutil.rmtree, here / "umoci")
        figures.unpacked_bytes = await asyncio.to_thread(directory_bytes, cache / "rootfs")
        async with LocalRuntime(image, runsc, agent_bundle=bundle) as runtime:
            boot, ready = await sandboxes(runtime, figures, boots, cold=True)
        figures.boot += boot
        figures.ready += ready
        if injected is not None:
            async with LocalRuntime(image, runsc, agent_bundle=bundle, inject_all=True) as runtime:
                boot, ready = await sandboxes(runtime, None, boots, cold=False)
            injected.boot += boot
            injected.ready += ready
    finally:
        del os.environ["SANDFLEET_CACHE"]
        await asyncio.to_thread(shutil.rmtree, here)
    log(
        NAME,
        f"round {index + 1} {name}: pull {figures.pull[-1]:.2f} s (skopeo {figures.skopeo[-1]:.2f} s), "
        f"unpack {figures.unpack[-1]:.2f} s (umoci {figures.umoci[-1]:.2f} s), "
        f"boot {figures.first_boot[-1]:.2f} s, ready {figures.first_ready[-1]:.2f} s",
    )


def median(values: list[float]) -> float:
    return round(statistics.median(values), 4)


def report(figures: dict[str, Figures], rounds: int, boots: int, version: str) -> dict[str, object]:
    """The medians and ratios as one JSON object (and a table on stderr)."""
    base = figures[BASE]
    base_started = statistics.median(base.boot) + statistics.median(base.ready)
    images: dict[str, dict[str, float | int]] = {}
    for name, f in figures.items():
        started = statistics.median(f.boot) + statistics.median(f.ready)
        row: dict[str, float | int] = {"boot_p50_s": median(f.boot), "ready_p50_s": median(f.ready)}
        row["boot_ready_over_base"] = round(started / base_started, 3)
        if f.pull:
            row.update(
                size_bytes=f.size_bytes,
                unpacked_bytes=f.unpacked_bytes,
                pull_p50_s=median(f.pull),
                skopeo_copy_p50_s=median(f.skopeo),
                pull_over_skopeo=round(statistics.median(f.pull) / statistics.median(f.skopeo), 3),
                unpack_p50_s=median(f.unpack),
                umoci_unpack_p50_s=median(f.umoci),
                unpack_over_umoci=round(statistics.median(f.unpack) / statistics.median(f.umoci), 3),
                first_boot_p50_s=median(f.first_boot),
                first_ready_p50_s=median(f.first_ready),
                cold_start_p50_s=round(f.cold(), 4),
            )
        images[name] = row
    lines = [
        f"cold start by phase, medians of {rounds} rounds ({boots} more boots each for boot/ready):",
        "| image | size (gzip / unpacked) | pull (sandfleet) | skopeo copy | ratio | unpack (sandfleet) "
        "| umoci raw unpack | ratio | first boot | first ready | cold total | boot p50 | ready p50 "
        "| boot+ready / base |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in images.items():
        if "pull_p50_s" in row:
            sizes = f"{row['size_bytes'] / 1e6:.1f} MB / {row['unpacked_bytes'] / 1e6:.0f} MB"
            cold = (
                f"{row['pull_p50_s']:.3f} s | {row['skopeo_copy_p50_s']:.3f} s "
                f"| {row['pull_over_skopeo']:.2f} | {row['unpack_p50_s']:.2f} s "
                f"| {row['umoci_unpack_p50_s']:.2f} s | {row['unpack_over_umoci']:.2f} "
                f"| {row['first_boot_p50_s']:.2f} s | {row['first_ready_p50_s']:.2f} s "
                f"| {row['cold_start_p50_s']:.2f} s"
            )
        else:
            sizes, cold = "(the base's rootfs)", " | ".join(["-"] * 9)
        lines.append(
            f"| {name} | {sizes} | {cold} | {row['boot_p50_s']:.3f} s | {row['ready_p50_s']:.3f} s "
            f"| {row['boot_ready_over_base']:.2f} |"
        )
    print("\n".join(lines), file=sys.stderr, flush=True)
    load = os.getloadavg()
    return {
        "benchmark": NAME,
        "rounds": rounds,
        "boots": boots,
        "runsc": version,
        "load_average": [round(x, 2) for x in load],
        "images": images,
    }


async def run(short: bool, rounds: int, boots: int) -> dict[str, object]:
    runsc, base_image, version = await prepare(NAME)
    bundle = await ensure_agent_bundle()
    log(NAME, "building (or finding) the images: the conda one takes minutes the first time")
    layouts = {"busybox": await asyncio.to_thread(build_foreign_image, "busybox"), BASE: base_image}
    if not short:
        layouts["conda"] = await asyncio.to_thread(build_conda_image)
    # On the disk the host's caches are on (not a tmpfs): the unpack writes where serve's would.
    work = Path(tempfile.mkdtemp(prefix="bench-image-cold-", dir=rootfs_cache().parent))
    registry = start_registry(work / "registry")
    try:
        references = {}
        for name, layout in layouts.items():
            log(NAME, f"pushing {name} to the local registry")
            await asyncio.to_thread(registry.push, f"oci:{layout.layout_ref}", f"{name}:bench")
            references[name] = f"{registry.host}/{name}:bench"
        figures = {name: Figures() for name in layouts}
        figures["base, injected"] = Figures()
        for index in range(rounds):
            for name, reference in references.items():
                injected = figures["base, injected"] if name == BASE else None
                await one_round(
                    index, name, reference, registry, figures[name], injected, work, runsc, bundle, boots
                )
    finally:
        registry.stop()
        shutil.rmtree(work, ignore_errors=True)
    return report(figures, rounds, boots, version)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--short", action="store_true", help="CI: busybox and base only, 1 round")
    parser.add_argument("--rounds", type=int, help="rounds of pull, unpack and boot (default 3; 1 short)")
    parser.add_argument("--boots", type=int, help="boots after the cold one, per round (default 5; 2 short)")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.short else 3)
    boots = args.boots or (2 if args.short else 5)
    print(json.dumps(asyncio.run(run(args.short, rounds, boots))))


if __name__ == "__main__":
    main()
