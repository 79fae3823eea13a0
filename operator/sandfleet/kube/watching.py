"""The informer's pure parts: splitting a chunked stream into lines, reading one event, the backoff."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tenacity import RetryCallState, wait_exponential
from tenacity.wait import wait_base

from sandfleet.kube.errors import Gone, KubeError

BOOKMARK = "BOOKMARK"
ERROR = "ERROR"


class LineSplitter:
    """Newline-delimited records from arbitrary chunks, with no limit on a record's length.

    aiohttp's `readline()` fails past its buffer limit (128 KiB), and a watch event carries the whole
    object (a ConfigMap or a Pod can be megabytes), so the stream is read in chunks and split here.
    """

    def __init__(self) -> None:
        self._pending = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        """The complete, non-blank lines `chunk` finishes; the rest waits for the next chunk."""
        self._pending += chunk
        end = self._pending.rfind(b"\n")
        if end < 0:
            return []
        complete = bytes(self._pending[:end])
        del self._pending[: end + 1]
        return [line for line in complete.split(b"\n") if line.strip()]

    def finish(self) -> list[bytes]:
        """What is left when the stream ends (a last line without its newline)."""
        rest, self._pending = bytes(self._pending), bytearray()
        return [rest] if rest.strip() else []


@dataclass(frozen=True)
class WatchEvent:
    """One decoded watch event: its type, the object, and the resourceVersion to resume from."""

    kind: str
    obj: dict[str, Any]
    version: str


def read_event(line: bytes, version: str) -> WatchEvent:
    """Decode one line of a watch; Gone when the history is gone (relist), KubeError for other errors."""
    event = json.loads(line)
    kind = str(event.get("type"))
    obj = event.get("object") or {}
    if kind == ERROR:
        code = int(obj.get("code") or 500)
        message = str(obj.get("message") or "watch error")
        if code == 410:
            raise Gone(message)
        raise KubeError(code, message)
    resumed = str((obj.get("metadata") or {}).get("resourceVersion") or version)
    return WatchEvent(kind, obj, resumed)


@dataclass(frozen=True)
class Backoff(wait_base):
    """Exponential backoff with jitter, as a tenacity wait: waits in [d, 2d), d doubling from `base` to `cap`.

    d is `base` before the second try of a round of tries, twice that before the third, and so on.
    The cap is low on purpose: after an apiserver restart every watcher must see the cluster again
    within seconds; the jitter keeps replicas from coming back in lockstep.
    """

    base: float = 0.5
    cap: float = 5.0
    rand: Callable[[], float] = field(default=random.random)

    def __call__(self, retry_state: RetryCallState) -> float:
        delay = wait_exponential(multiplier=self.base, max=self.cap)(retry_state)
        return delay + self.rand() * delay
