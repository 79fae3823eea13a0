"""Archive links under real gVisor: an upload whose links resolve outside the working area, in any
order of entries, is refused and leaves nothing outside it (the agent is root in the sandbox)."""

from __future__ import annotations

import io
import tarfile

import httpx
import pytest

from tests.e2e.local.conftest import sh

pytestmark = pytest.mark.gvisor


def _archive(entries: list[tuple[str, str | None]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, target in entries:
            info = tarfile.TarInfo(name)
            if target is None:
                info.size = 5
                tar.addfile(info, io.BytesIO(b"owned"))
            else:
                info.type = tarfile.SYMTYPE
                info.linkname = target
                tar.addfile(info)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "entries",
    [
        [("esc", "a/../../.."), ("a", "."), ("esc/etc/escaped", None)],
        [("esc", "a/b/../../../.."), ("a", "."), ("a/b", "."), ("esc/escaped", None)],
        [("a", "."), ("esc", "a/../../.."), ("esc/escaped", None)],
    ],
    ids=["link-made-outward-later", "two-links-later", "outward-at-once"],
)
async def test_an_archive_whose_links_resolve_outside_in_any_order_is_refused(
    agent: httpx.AsyncClient, entries: list[tuple[str, str | None]]
) -> None:
    response = await agent.put("/v1/files/archive", params={"path": "deep/sub"}, content=_archive(entries))
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "unsafe_archive"
    probe = await sh(
        agent, "ls /escaped /etc/escaped /workspace/escaped 2>&1; find /workspace -type l -exec realpath {} +"
    )
    assert "owned" not in str(probe["stdout"])
    assert str(probe["stdout"]).count("No such file") == 3, probe
    for real in str(probe["stdout"]).splitlines()[3:]:
        assert real.startswith("/workspace"), real
