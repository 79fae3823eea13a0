"""Starts a runtime with two sandboxes, prints what it owns, then waits to be SIGKILLed (a crash)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from sandfleet.local.artifacts import image_ref_from_json
from sandfleet.local.runtime import LocalRuntime


async def main(runsc: str, image_json: str) -> None:
    runtime = LocalRuntime(image_ref_from_json(image_json), Path(runsc))
    await runtime.start()
    sandboxes = [await runtime.create(), await runtime.create()]
    owned = {
        "instance_id": runtime.instance_id,
        "instance_dir": str(runtime.instance_dir),
        "runsc_root": str(runtime.runsc_root),
        "sandboxes": [{"id": s.id, "slot": s.slot} for s in sandboxes],
    }
    print(json.dumps(owned), flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
