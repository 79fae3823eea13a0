"""The one informer: a paged list, then a watch with bookmarks, relisting on 410 Gone, forever.

Consumers see `on_event("SYNC", {})` when a (re)list begins, `ADDED` for every listed object, then
`on_synced()`, then the watch's events. Each consumer takes them through a `KeyedFeed`
(`kube/keyed_feed.py`): upserts and deletes by key, and on a relist the deletes of whatever the
new list did not show.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

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
        backoff: Callable[[RetryCallState], float] | None = None,  # the wait before a retry
        page_size: int = LIST_PAGE,
    ) -> None:
        self.kube = kube
        self.path = path
        self.on_event = on_event
        self.on_synced = on_synced
        self.query = dict(query or {})
        self.resource = resource or path.rsplit("/", 1)[-1]
        self.backoff: Callable[[RetryCallState], float] = backoff or Backoff()
        self.page_size = page_size
        self.connected = False  # whether the last list succeeded and no failure followed
        self._version: str | None = None  # where the watch resumes (None: list first)
        self._reason = ""  # why the next list is made (the relists metric's label)

    async def run(self) -> None:
        """List, then watch from where the list left off, until cancelled.

        A 410 relists at once; any other failure backs off first. Each list that succeeds ends a
        round of tries, so the backoff after the next failure starts again from its shortest wait.
        """
        self._version, self._reason = None, "start"
        while True:  # until cancelled
            retrying = AsyncRetrying(
                retry=retry_if_exception_type(Exception),  # a consumer's bug too: its cache must not go stale
                wait=self._wait,
                before_sleep=self._failed,
            )
            await retrying(self._resume)

    async def _resume(self) -> None:
        """Watch from the last version until the watch fails; list when there is none (or a 410 says so)."""
        if self._version is not None:
            try:
                while True:
                    self._version = await self._watch(self._version)
            except Gone:
                self._relisting()
            finally:
                self._version = None
        version = await self._list(self._reason)
        self.on_synced()
        self.connected = True
        self._version = version

    def _wait(self, retry_state: RetryCallState) -> float:
        """No wait before relisting after a 410; the backoff after anything else."""
        failed = retry_state.outcome.exception() if retry_state.outcome is not None else None
        return 0.0 if isinstance(failed, Gone) else self.backoff(retry_state)

    def _failed(self, retry_state: RetryCallState) -> None:
        failed = retry_state.outcome.exception() if retry_state.outcome is not None else None
        if isinstance(failed, Gone):
            self._relisting()
            return
        self._reason = "failure"
        if isinstance(failed, RETRIED):
            what = f"watch on {self.path} failed ({failed})"
        else:
            # A bug in a consumer must not silently end the watch: its cache would go stale forever.
            log.error("watch on %s broke", self.path, exc_info=failed)
            what = f"watch on {self.path} broke"
        self.connected = False
        RESTARTS.labels(self.resource).inc()
        log.warning("%s; retrying in %.1fs", what, retry_state.upcoming_sleep)

    def _relisting(self) -> None:
        log.info("watch on %s: history gone (410); relisting", self.path)
        self._reason = "gone"

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
