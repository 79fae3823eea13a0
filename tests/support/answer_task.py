"""The smallest coding task, for adapters' end-to-end tests: write 42 to answer.txt, over `serve --local`."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tests.support.servers import start_local_serve, stop_local_serve

INSTRUCTION = "Write 42 to answer.txt."
ANSWER_IS_42 = {"shell": 'test "$(cat answer.txt)" = 42'}  # the task's tests, as `evaluate` options
ANSWER_PATCH = "--- /dev/null\n+++ b/answer.txt\n@@ -0,0 +1 @@\n+42\n"  # its solution, as a diff


@contextmanager
def serving(directory: Path, tokens: Mapping[str, str] | None = None) -> Iterator[str]:
    """A real `sandfleet serve --local` with warm sandboxes of pool `python`, for the block's length."""
    url, process, log = start_local_serve(directory, tokens)
    try:
        yield url
    finally:
        stop_local_serve(process, log)
