"""Which gateway and token the client sends with: a token file is re-read when Kubernetes rotates it."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from sandfleet.client import Fleet


def test_a_token_file_is_read_per_request_and_reread_when_rotated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Authorization"))
        return httpx.Response(200, json={"pools": []})

    token = tmp_path / "token"
    token.write_text("first\n")
    monkeypatch.delenv("SANDFLEET_TOKEN", raising=False)
    monkeypatch.setenv("SANDFLEET_TOKEN_FILE", str(token))
    with Fleet("http://gateway", transport=httpx.MockTransport(handler)) as fleet:
        fleet.pools()
        token.write_text("second\n")
        os.utime(token, (1, 1))  # the kubelet swaps the file: a new mtime
        fleet.pools()
    with Fleet("http://gateway", token="given", transport=httpx.MockTransport(handler)) as fleet:
        fleet.pools()  # a token passed in wins over the file
    monkeypatch.setenv("SANDFLEET_TOKEN", "from-env")
    with Fleet("http://gateway", transport=httpx.MockTransport(handler)) as fleet:
        fleet.pools()  # so does SANDFLEET_TOKEN
    assert seen == ["Bearer first", "Bearer second", "Bearer given", "Bearer from-env"]
