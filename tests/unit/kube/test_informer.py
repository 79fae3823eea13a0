"""The informer's loop against a scripted apiserver: pages, watch events in chunks, relist on 410."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from tenacity import RetryCallState

from sandfleet.kube.errors import KubeError
from sandfleet.kube.informer import Informer
from sandfleet.kube.watching import Backoff


class _Content:
    def __init__(self, stream: bytes) -> None:
        self.stream = stream

    async def iter_chunked(self, size: int) -> AsyncIterator[bytes]:
        for start in range(0, len(self.stream), 7):  # tiny chunks: every event is cut somewhere
            yield self.stream[start : start + 7]


class _Response:
    def __init__(self, stream: bytes) -> None:
        self.content = _Content(stream)
        self.released = False

    def release(self) -> None:
        self.released = True


def _event(kind: str, name: str, version: str) -> dict[str, Any]:
    return {"type": kind, "object": {"metadata": {"name": name, "resourceVersion": version}}}


class ScriptedKube:
    """Answers lists page by page and watches from a script; records what was asked."""

    def __init__(
        self, watches: list[list[dict[str, Any]] | Exception], failing_lists: frozenset[int] = frozenset()
    ) -> None:
        self.watches = watches
        self.failing_lists = failing_lists  # which lists (0 the first) fail, counted by their first page
        self.list_starts = 0
        self.lists: list[dict[str, Any]] = []
        self.watched_from: list[str] = []
        self.responses: list[_Response] = []

    async def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        query = kwargs["query"]
        self.lists.append(dict(query))
        if "continue" not in query:
            self.list_starts += 1
            if self.list_starts - 1 in self.failing_lists:
                raise KubeError(503, "the apiserver is restarting")
            return {"items": [{"metadata": {"name": "a"}}], "metadata": {"continue": "page2"}}
        return {"items": [{"metadata": {"name": "b"}}], "metadata": {"resourceVersion": "10"}}

    async def request(self, method: str, path: str, **kwargs: Any) -> _Response:
        query = kwargs["query"]
        assert query["allowWatchBookmarks"] is True
        self.watched_from.append(query["resourceVersion"])
        if not self.watches:
            await asyncio.Event().wait()  # the last watch stays open until the test ends it
        script = self.watches.pop(0)
        if isinstance(script, Exception):
            raise script
        response = _Response(b"".join(json.dumps(e).encode() + b"\n" for e in script))
        self.responses.append(response)
        return response


async def _run(
    kube: ScriptedKube, until: int, backoff: Callable[[RetryCallState], float] | None = None
) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    informer = Informer(
        kube,  # type: ignore[arg-type]
        "/api/v1/pods",
        lambda kind, obj: seen.append((kind, (obj.get("metadata") or {}).get("name", ""))),
        lambda: seen.append(("SYNCED", "")),
        page_size=1,
        backoff=backoff or Backoff(base=0.001, cap=0.001),
    )
    task = asyncio.create_task(informer.run())
    while len(kube.watched_from) < until:  # noqa: ASYNC110 (the script counts, it has no events)
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.01)
    assert informer.connected
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return seen


async def test_pages_then_events_then_a_relist_on_410() -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}
    kube = ScriptedKube(
        [[_event("ADDED", "c", "11"), _event("BOOKMARK", "", "15"), gone], [_event("DELETED", "a", "20")]]
    )
    seen = await _run(kube, until=3)
    listed = [("SYNC", ""), ("ADDED", "a"), ("ADDED", "b"), ("SYNCED", "")]
    assert seen == [*listed, ("ADDED", "c"), *listed, ("DELETED", "a")]
    assert [q.get("continue") for q in kube.lists] == [None, "page2", None, "page2"]
    assert all(q["limit"] == 1 for q in kube.lists)
    # Resumed from the list's version, then relisted; a normal end resumes from the last event seen.
    assert kube.watched_from == ["10", "10", "20"]
    assert all(r.released for r in kube.responses)


async def test_a_failed_watch_backs_off_and_relists() -> None:
    kube = ScriptedKube([KubeError(500, "etcd down")])
    seen = await _run(kube, until=2)
    assert seen.count(("SYNC", "")) == 2


async def test_the_backoff_starts_again_after_each_list_that_succeeds_and_a_410_waits_for_nothing() -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}
    # list, watch fails, list fails twice, list, watch ends with a 410, list, watch fails, list, watch
    kube = ScriptedKube(
        [KubeError(500, "etcd down"), [gone], KubeError(500, "etcd down")], failing_lists=frozenset({1, 2})
    )
    waits: list[int] = []

    def backoff(state: RetryCallState) -> float:
        waits.append(state.attempt_number)  # the how-manieth try of its round failed
        return 0.001

    await _run(kube, until=4, backoff=backoff)
    assert waits == [1, 2, 3, 1]
    assert kube.list_starts == 6
