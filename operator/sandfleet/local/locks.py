"""Host file locks (flock) the local runtime's processes coordinate by: blocking, or tried once."""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path


def lock(path: Path) -> int:
    """Take the exclusive lock at `path` (made, with its directory, if missing), waiting for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    return descriptor


def try_lock(path: Path) -> int | None:
    """Take the exclusive lock at `path` without waiting; None if someone holds it."""
    descriptor = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    return descriptor


@asynccontextmanager
async def held(path: Path) -> AsyncIterator[None]:
    """Hold the lock at `path` for the block, waiting for it in a thread (the event loop goes on)."""
    descriptor = await asyncio.to_thread(lock, path)
    try:
        yield
    finally:
        os.close(descriptor)
