"""A sandbox's output pipe: only the last 64 KiB are kept, draining is rate-limited, EOF is noticed."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from sandfleet.local import runtime
from sandfleet.local.runtime import OUTPUT_TAIL_BYTES, _OutputTail


async def test_only_the_tail_is_kept_and_the_end_is_noticed() -> None:
    read_end, write_end = os.pipe()
    ended = asyncio.Event()
    tail = _OutputTail(read_end, ended.set)

    def flood() -> None:
        for n in range(64):
            os.write(write_end, bytes([65 + n % 26]) * 16384)
        os.write(write_end, b"last words")
        os.close(write_end)

    await asyncio.gather(asyncio.to_thread(flood), asyncio.wait_for(ended.wait(), 10))
    kept = tail.tail()
    assert len(kept) == OUTPUT_TAIL_BYTES
    assert kept.endswith(b"last words")
    tail.close()


async def test_a_flood_is_drained_no_faster_than_the_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "OUTPUT_DRAIN_BYTES_PER_S", 256 * 1024)
    read_end, write_end = os.pipe()
    ended = asyncio.Event()
    tail = _OutputTail(read_end, ended.set)

    def flood() -> None:
        for _ in range(16):
            os.write(write_end, b"x" * 65536)  # 1 MiB: four seconds' worth at this rate
        os.close(write_end)

    started = time.monotonic()
    await asyncio.gather(asyncio.to_thread(flood), asyncio.wait_for(ended.wait(), 20))
    assert time.monotonic() - started >= 2.5
    tail.close()
