"""Reads an image's small files (its /etc/passwd and /etc/group) without following any link in it.

The image is untrusted and whoever reads it is root (the local runtime on the host, the agent in
the sandbox): `/etc/passwd` may be a link to another file, or a FIFO. Each component is opened
relative to the last without following a link, and only a regular file of at most
MAX_IMAGE_FILE_BYTES is read. One reader for both runtimes, so the same image names the same
users on either (sandfleet/local/image.py imports it).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_IMAGE_FILE_BYTES = 4 << 20


def read_image_file(root: str | Path, relative: str) -> str | None:
    """A regular file under `root`, None if absent, a link on the way, not a file, or too big."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    parts = [part for part in relative.split("/") if part]
    try:
        fd = os.open(root, flags | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            child = os.open(part, flags | (os.O_NONBLOCK if last else os.O_DIRECTORY), dir_fd=fd)
            os.close(fd)
            fd = child
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = b""
        while len(data) <= MAX_IMAGE_FILE_BYTES:
            chunk = os.read(fd, MAX_IMAGE_FILE_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:
        return None
    finally:
        os.close(fd)
    return None if len(data) > MAX_IMAGE_FILE_BYTES else data.decode("utf-8", "replace")
