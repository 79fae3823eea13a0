"""Byte streams over the HTTP connection: bounded and chunked request bodies, chunked responses."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from io import BufferedIOBase
from typing import Protocol

from sandfleet_agent.errors import bad_request


class ByteSource(Protocol):
    """Anything bytes can be read from (what tarfile and the file copier need)."""

    def read(self, size: int = -1, /) -> bytes:
        """Read up to `size` bytes (all when negative); b'' at the end."""
        ...


class ByteSink(Protocol):
    """Anything bytes can be written to."""

    def write(self, data: bytes, /) -> object:
        """Write all of `data`."""
        ...


class StreamFile(Protocol):
    """The file-object shape tarfile's stream modes accept."""

    def read(self, size: int = -1, /) -> bytes:
        """Read up to `size` bytes."""
        ...

    def write(self, data: bytes, /) -> object:
        """Write all of `data`."""
        ...

    def tell(self) -> int:
        """Return the position."""
        ...

    def seek(self, pos: int, /) -> object:
        """Move the position."""
        ...

    def close(self) -> object:
        """Release the stream."""
        ...


class _NotSeekable:
    """The seek/tell half of a file object that tarfile's stream modes never call."""

    def tell(self) -> int:
        """Refuse: streams are not seekable."""
        raise OSError("stream is not seekable")

    def seek(self, pos: int, /) -> int:
        """Refuse: streams are not seekable."""
        raise OSError("stream is not seekable")

    def write(self, data: bytes, /) -> int:
        """Refuse: this stream is read-only."""
        raise OSError("stream is read-only")

    def close(self) -> None:
        """Nothing to release: the connection outlives the body."""


class LimitedReader(_NotSeekable):
    """Reads at most the announced Content-Length, reporting what is left after each read."""

    def __init__(self, rfile: BufferedIOBase, length: int, on_progress: Callable[[int], None]) -> None:
        self._rfile = rfile
        self._left = length
        self._on_progress = on_progress

    def read(self, size: int = -1, /) -> bytes:
        """Read up to `size` bytes of the body."""
        if self._left <= 0:
            return b""
        want = self._left if size < 0 else min(size, self._left)
        data = self._rfile.read(want)
        self._left -= len(data)
        if not data:
            self._left = 0
        self._on_progress(self._left)
        return data

    def drain(self) -> None:
        """Read and drop what is left, so the connection can serve the next request."""
        while self.read(1 << 16):
            pass


class ChunkedReader(_NotSeekable):
    """Decodes a `Transfer-Encoding: chunked` request body."""

    def __init__(self, rfile: BufferedIOBase) -> None:
        self._rfile = rfile
        self._left_in_chunk = 0
        self._done = False

    def read(self, size: int = -1, /) -> bytes:
        """Read up to `size` decoded bytes."""
        out = bytearray()
        while not self._done and (size < 0 or len(out) < size):
            if self._left_in_chunk == 0 and not self._next_chunk():
                break
            want = self._left_in_chunk if size < 0 else min(self._left_in_chunk, size - len(out))
            data = self._rfile.read(want)
            if not data:
                raise bad_request("the chunked body ended early", code="bad_body")
            out.extend(data)
            self._left_in_chunk -= len(data)
            if self._left_in_chunk == 0:
                self._rfile.readline(16)
        return bytes(out)

    def _next_chunk(self) -> bool:
        line = self._rfile.readline(1024)
        try:
            self._left_in_chunk = int(line.split(b";", 1)[0].strip() or b"0", 16)
        except ValueError:
            raise bad_request("malformed chunked body", code="bad_body") from None
        if self._left_in_chunk == 0:
            while self._rfile.readline(1024).strip():
                pass
            self._done = True
            return False
        return True


class ChunkedWriter:
    """Writes a chunked response body; each write is one chunk."""

    def __init__(self, wfile: BufferedIOBase) -> None:
        self._wfile = wfile
        self._lock = threading.Lock()

    def write(self, data: bytes, /) -> int:
        """Send `data` as one chunk."""
        if data:
            with self._lock:
                self._wfile.write(b"%x\r\n%s\r\n" % (len(data), bytes(data)))
        return len(data)

    def event(self, body: dict[str, object]) -> None:
        """Send one NDJSON event."""
        self.write(json.dumps(body, separators=(",", ":")).encode() + b"\n")

    def tell(self) -> int:
        """Refuse: streams are not seekable."""
        raise OSError("stream is not seekable")

    def seek(self, pos: int, /) -> int:
        """Refuse: streams are not seekable."""
        raise OSError("stream is not seekable")

    def read(self, size: int = -1, /) -> bytes:
        """Refuse: this stream is write-only."""
        raise OSError("stream is write-only")

    def flush(self) -> None:
        """Flush the connection."""
        self._wfile.flush()

    def close(self) -> None:
        """End the body."""
        with self._lock:
            self._wfile.write(b"0\r\n\r\n")
