"""An informer's events as upserts and deletes by key: what a (re)list did not show is deleted."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

from sandfleet.kube.informer import SYNC

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def as_is(obj: dict[str, Any]) -> dict[str, Any]:
    """The `read` of a consumer that keeps (or reads itself) the object as the watch gave it."""
    return obj


class KeyedFeed(Generic[K, V]):
    """Feeds one consumer's keyed state from an `Informer` (pass it `on_event` and `on_synced`).

    Each object is read (`read`: None for one the consumer does not keep, which is then ignored
    altogether) and keyed (`key`). A watch event is an `upsert(key, value)`, or a `delete(key)`
    for DELETED. A (re)list is the truth: once it ends, every key the consumer holds (`held`, the
    consumer's own keys, however it learned them: a watch, a write's answer, a read) that the list
    did not show is deleted, then `listed()` is called.

    How a relist reaches the consumer, by the consumer's choice:

    - as it goes (no `replace`): each listed object is upserted at once, and the deletes come at
      the end. Only the listed keys are kept here, so a list of 10,000 Pods is never held whole.
    - whole (`replace`): the listed values are held until the list ends and then handed over in
      one call, `replace(listed, gone)`, with the keys the list did not show (`delete` is not
      called for them); readers of the consumer never see half a relist.

    Pure bookkeeping, no I/O; the informer calls it from its one task.
    """

    def __init__(
        self,
        read: Callable[[dict[str, Any]], V | None],
        key: Callable[[V], K],
        upsert: Callable[[K, V], None],
        delete: Callable[[K], None],
        held: Callable[[], Iterable[K]],
        listed: Callable[[], None],
        *,
        replace: Callable[[dict[K, V], list[K]], None] | None = None,
    ) -> None:
        self._read = read
        self._key = key
        self._upsert = upsert
        self._delete = delete
        self._held = held
        self._listed = listed
        self._replace = replace
        # The (re)list in progress (None: none): the keys it showed so far, or, when the consumer
        # takes a relist whole, its values by key.
        self._shown: set[K] | None = None
        self._holding: dict[K, V] | None = None

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        """An informer event: SYNC begins a (re)list; ADDED, MODIFIED or DELETED one object."""
        if kind == SYNC:
            if self._replace is None:
                self._shown = set()
            else:
                self._holding = {}
            return
        value = self._read(obj)
        if value is None:
            return
        key = self._key(value)
        holding = self._holding
        if holding is not None:
            if kind == "DELETED":
                holding.pop(key, None)
            else:
                holding[key] = value
            return
        if self._shown is not None:
            self._shown.add(key)
        if kind == "DELETED":
            self._delete(key)
        else:
            self._upsert(key, value)

    def on_synced(self) -> None:
        """The (re)list ended: delete (or replace) what it did not show, then `listed()`."""
        shown, holding = self._shown, self._holding
        self._shown = self._holding = None
        if holding is not None and self._replace is not None:
            self._replace(holding, [k for k in self._held() if k not in holding])
        elif shown is not None:
            for key in [k for k in self._held() if k not in shown]:
                self._delete(key)
        self._listed()
