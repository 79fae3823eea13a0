"""The one informer: a paged list, then a watch with bookmarks, relisting on 410 Gone, forever.

Consumers see `on_event("SYNC", {})` when a (re)list begins, `ADDED` for every listed object, then
`on_synced()`, then the watch's events; on a relist they drop whatever the new list did not show.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from sandfleet.kube.api_calls import LIST_TIMEOUT, WATCH_SECONDS, WATCH_TIMEOUT, KubeClient
from sandfleet.kube.errors import Gone, KubeError
from sandfleet.kube.metrics import RELISTS, RESTARTS, WATCH_EVENTS
from sandfleet.kube.watching import BOOKMARK, Backoff, LineSplitter, read_event

log = logging.getLogger(__name__)

SYNC = "SYNC"
LIST_PAGE = 1000
# Chunks, not lines: a line longer than aiohttp's buffer limit would fail readline() (see LineSplitter).
CHUNK_BYTES = 1024 * 1024
# Errors after which the informer backs off and relists; anything else is a consumer bug, logged in full.
RETRIED = (TimeoutError, KubeError, aiohttp.ClientError, OSError, ValueError)

EventHandler = Callable[[str, dict[str, Any]], None]


class Informer:
    """Keeps a consumer current with one collection (`path`, e.g. /api/v1/pods) until cancelled."""

    def __init__(
        self,
        kube: KubeClient,
        path: str,
        on_event: EventHandler,
        on_synced: Callable[[], None],
        *,
        query: Mapping[str, str] | None = None,
        resource: str | None = None,
        backoff: Backoff | None = None,
        page_size: int = LIST_PAGE,
    ) -> None:
        self.kube = kube
        self.path = path
        self.on_event = on_event
        self.on_synced = on_synced
        self.query = dict(query or {})
        self.resource = resource or path.rsplit("/", 1)[-1]
        self.backoff = backoff or Backoff()
        self.page_size = page_size
        self.connected = False  # whether the last list succeeded and no failure followed

    async def run(self) -> None:
        reason = "start"
        while True:  # until cancelled
            try:
                version = await self._list(reason)
                self.on_synced()
                self.connected = True
                self.backoff.reset()
                while True:
                    version = await self._watch(version)
            except asyncio.CancelledError:
                raise
            except Gone:
                log.info("watch on %s: history gone (410); relisting", self.path)
                reason = "gone"
            except RETRIED as error:
                reason = "failure"
                await self._back_off(f"watch on {self.path} failed ({error})")
            except Exception:
                # A bug in a consumer must not silently end the watch: its cache would go stale forever.
                log.exception("watch on %s broke", self.path)
                reason = "failure"
                await self._back_off(f"watch on {self.path} broke")

    async def _back_off(self, what: str) -> None:
        self.connected = False
        RESTARTS.labels(self.resource).inc()
        delay = self.backoff.next()
        log.warning("%s; retrying in %.1fs", what, delay)
        await asyncio.sleep(delay)

    async def _list(self, reason: str) -> str:
        """List every page, feeding each object as ADDED; the resourceVersion to watch from."""
        RELISTS.labels(self.resource, reason).inc()
        self.on_event(SYNC, {})
        token = ""
        while True:
            params: dict[str, str | int | bool] = {**self.query, "limit": self.page_size}
            if token:
                params["continue"] = token
            page = await self.kube.json("GET", self.path, query=params, deadline=LIST_TIMEOUT)
            for item in page.get("items") or ():
                self.on_event("ADDED", item)
            metadata = page.get("metadata") or {}
            token = metadata.get("continue") or ""
            if not token:
                return str(metadata.get("resourceVersion", ""))

    async def _watch(self, version: str) -> str:
        """Follow one watch request until the server ends it; the resourceVersion to resume from."""
        params: dict[str, str | int | bool] = {
            **self.query,
            "watch": True,
            "resourceVersion": version,
            "allowWatchBookmarks": True,
            "timeoutSeconds": WATCH_SECONDS,
        }
        response = await self.kube.request("GET", self.path, query=params, deadline=WATCH_TIMEOUT)
        splitter = LineSplitter()
        try:
            async for chunk in response.content.iter_chunked(CHUNK_BYTES):
                for line in splitter.feed(chunk):
                    version = self._deliver(line, version)
            for line in splitter.finish():
                version = self._deliver(line, version)
        finally:
            response.release()
        return version

    def _deliver(self, line: bytes, version: str) -> str:
        event = read_event(line, version)
        WATCH_EVENTS.labels(self.resource, event.kind).inc()
        if event.kind != BOOKMARK:
            self.on_event(event.kind, event.obj)
        return event.version
