"""The informer's pure parts: lines split across chunks, one event read, the relist decision, backoff."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tenacity import AsyncRetrying, RetryCallState

from sandfleet.kube.errors import Gone, KubeError
from sandfleet.kube.watching import Backoff, LineSplitter, read_event


def _split(stream: bytes, cuts: list[int]) -> list[bytes]:
    splitter = LineSplitter()
    lines: list[bytes] = []
    start = 0
    for cut in [*sorted(cuts), len(stream)]:
        lines += splitter.feed(stream[start:cut])
        start = cut
    return lines + splitter.finish()


def test_a_line_longer_than_any_chunk_arrives_whole() -> None:
    big = b'{"type":"ADDED","object":{"data":"' + b"x" * 3_000_000 + b'"}}'
    chunks = [big[i : i + 65536] for i in range(0, len(big), 65536)] + [b"\n"]
    splitter = LineSplitter()
    lines = [line for chunk in chunks for line in splitter.feed(chunk)]
    assert lines == [big]
    assert splitter.finish() == []


def test_several_lines_in_one_chunk_and_a_last_line_without_newline() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"a\n\nb\nc") == [b"a", b"b"]
    assert splitter.feed(b"c") == []
    assert splitter.finish() == [b"cc"]
    assert splitter.finish() == []


@given(st.lists(st.binary(min_size=1).filter(lambda b: b"\n" not in b and b.strip()), max_size=8), st.data())
def test_any_cutting_of_a_stream_gives_the_same_lines(lines: list[bytes], data: st.DataObject) -> None:
    stream = b"\n".join(lines) + b"\n"
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    assert _split(stream, cuts) == lines


def _line(kind: str, obj: dict[str, object]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode()


def test_an_event_moves_the_version_on_and_a_bookmark_too() -> None:
    event = read_event(_line("MODIFIED", {"metadata": {"name": "p", "resourceVersion": "42"}}), "7")
    assert (event.kind, event.version, event.obj["metadata"]) == (
        "MODIFIED",
        "42",
        {"name": "p", "resourceVersion": "42"},
    )
    assert read_event(_line("BOOKMARK", {"metadata": {"resourceVersion": "50"}}), "42").version == "50"
    assert read_event(_line("ADDED", {"metadata": {}}), "42").version == "42"


def test_410_gone_asks_for_a_relist_and_other_errors_are_kube_errors() -> None:
    with pytest.raises(Gone):
        read_event(
            _line("ERROR", {"kind": "Status", "code": 410, "message": "too old resource version"}), "1"
        )
    with pytest.raises(KubeError) as caught:
        read_event(_line("ERROR", {"kind": "Status", "code": 500, "message": "etcd down"}), "1")
    assert caught.value.status == 500
    assert not isinstance(caught.value, Gone)


def _after_try(attempt: int) -> RetryCallState:
    """The state tenacity hands a wait once the `attempt`th try of a round has failed."""
    state = RetryCallState(retry_object=AsyncRetrying(), fn=None, args=(), kwargs={})
    state.attempt_number = attempt
    return state


def test_backoff_doubles_with_jitter_up_to_its_cap() -> None:
    lowest = Backoff(base=0.5, cap=5.0, rand=lambda: 0.0)
    assert [lowest(_after_try(n)) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    highest = Backoff(base=0.5, cap=5.0, rand=lambda: 0.999)
    waits = [highest(_after_try(n)) for n in range(1, 7)]
    assert all(w < 2 * low for w, low in zip(waits, [0.5, 1.0, 2.0, 4.0, 5.0, 5.0], strict=True))
    assert highest(_after_try(1)) < 1.0  # a new round of tries starts from the shortest wait again


@given(
    st.integers(min_value=1, max_value=10_000),
    st.floats(min_value=0.001, max_value=10.0),
    st.floats(min_value=0.001, max_value=60.0),
    st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_a_wait_is_between_its_doubled_step_and_twice_that(
    attempt: int, base: float, cap: float, draw: float
) -> None:
    step = min(cap, base * 2.0 ** min(attempt - 1, 64))
    wait = Backoff(base=base, cap=cap, rand=lambda: draw)(_after_try(attempt))
    assert wait == pytest.approx(step + draw * step)
    assert step * (1 - 1e-9) <= wait < 2 * step * (1 + 1e-9)


def test_backoff_jitter_spreads_replicas() -> None:
    # Each replica draws its jitter from the process's generator (seeded differently per process);
    # 20 of them are stood in for by draws from one seeded generator, the same every run.
    assert Backoff().rand == random.random
    draws = random.Random(0).random
    waits = {round(Backoff(rand=draws)(_after_try(1)), 6) for _ in range(20)}
    assert len(waits) > 1
    assert all(0.5 <= w < 1.0 for w in waits)
