"""File operations through the agent: read, write, list, stat, delete, tar both ways, and confinement."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.unit.agent.conftest import Agent


def test_write_then_read_binary_roundtrip(agent: Agent) -> None:
    payload = bytes(range(256)) * 1000
    written = agent.client.put(
        "/v1/files", params={"path": "deep/dir/blob.bin", "mode": "0600"}, content=payload
    )
    assert written.status_code == 200
    assert written.json() == {"path": "deep/dir/blob.bin", "size": len(payload)}
    assert (agent.root / "deep/dir/blob.bin").stat().st_mode & 0o777 == 0o600
    read = agent.client.get("/v1/files", params={"path": "deep/dir/blob.bin"})
    assert read.status_code == 200
    assert read.content == payload


def test_chunked_upload(agent: Agent) -> None:
    chunks = [b"a" * 70000, b"b" * 5, b"c" * 100000]
    response = agent.client.put("/v1/files", params={"path": "chunked.txt"}, content=iter(chunks))
    assert response.status_code == 200
    assert (agent.root / "chunked.txt").read_bytes() == b"".join(chunks)


def test_absolute_path_inside_root_is_accepted(agent: Agent) -> None:
    path = str(agent.root.resolve() / "abs.txt")
    assert agent.client.put("/v1/files", params={"path": path}, content=b"x").status_code == 200
    assert agent.client.get("/v1/files", params={"path": "abs.txt"}).content == b"x"


def test_list_stat_and_delete(agent: Agent) -> None:
    (agent.root / "a").mkdir()
    (agent.root / "a" / "one.txt").write_text("1")
    (agent.root / "b.txt").write_text("22")
    os.symlink("b.txt", agent.root / "link")
    flat = agent.client.get("/v1/files/list").json()
    assert [entry["name"] for entry in flat["entries"]] == ["a", "b.txt", "link"]
    assert {entry["name"]: entry["type"] for entry in flat["entries"]} == {
        "a": "directory",
        "b.txt": "file",
        "link": "symlink",
    }
    deep = agent.client.get("/v1/files/list", params={"path": ".", "recursive": "1"}).json()
    assert "a/one.txt" in [entry["path"] for entry in deep["entries"]]
    stat = agent.client.get("/v1/files/stat", params={"path": "b.txt"}).json()
    assert stat["size"] == 2
    assert stat["type"] == "file"

    not_empty = agent.client.delete("/v1/files", params={"path": "a"})
    assert not_empty.status_code == 422
    assert not_empty.json()["error"]["code"] == "directory_not_empty"
    assert agent.client.delete("/v1/files", params={"path": "a", "recursive": "1"}).status_code == 200
    assert not (agent.root / "a").exists()
    # Deleting a symlink removes the link, never its target.
    assert agent.client.delete("/v1/files", params={"path": "link"}).status_code == 200
    assert (agent.root / "b.txt").exists()
    root = agent.client.delete("/v1/files", params={"path": ".", "recursive": "1"})
    assert root.json()["error"]["code"] == "cannot_delete_root"


@pytest.mark.parametrize("path", ["../outside.txt", "a/../../outside.txt", "/etc/passwd", "/tmp/x"])
def test_paths_outside_the_root_are_refused(agent: Agent, path: str) -> None:
    for response in (
        agent.client.get("/v1/files", params={"path": path}),
        agent.client.put("/v1/files", params={"path": path}, content=b"x"),
        agent.client.delete("/v1/files", params={"path": path}),
        agent.client.get("/v1/files/list", params={"path": path}),
    ):
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "path_outside_root"


def test_symlink_pointing_outside_is_refused(agent: Agent) -> None:
    outside = agent.root.parent / "secret.txt"
    outside.write_text("secret")
    os.symlink(outside, agent.root / "escape")
    os.symlink(agent.root.parent, agent.root / "escape_dir")
    assert agent.client.get("/v1/files", params={"path": "escape"}).status_code == 403
    write = agent.client.put("/v1/files", params={"path": "escape_dir/new.txt"}, content=b"x")
    assert write.status_code == 403
    assert not (agent.root.parent / "new.txt").exists()


def test_missing_files_and_wrong_types(agent: Agent) -> None:
    missing = agent.client.get("/v1/files", params={"path": "nope.txt"})
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "file_not_found"
    (agent.root / "dir").mkdir()
    assert agent.client.get("/v1/files", params={"path": "dir"}).json()["error"]["code"] == "is_a_directory"
    (agent.root / "file").write_text("x")
    listing = agent.client.get("/v1/files/list", params={"path": "file"})
    assert listing.json()["error"]["code"] == "not_a_directory"
    assert agent.client.get("/v1/files").json()["error"]["code"] == "bad_request"
    bad_mode = agent.client.put("/v1/files", params={"path": "m", "mode": "rwx"}, content=b"")
    assert bad_mode.status_code == 400


def _tar(members: dict[str, bytes], *, gzip: bool = False) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gzip else "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755 if name.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.parametrize("gzip", [False, True])
def test_archive_upload_and_download_roundtrip(agent: Agent, gzip: bool) -> None:
    members = {"repo/README": b"hello", "repo/src/main.py": b"print(1)\n", "repo/run.sh": b"#!/bin/sh\n"}
    up = agent.client.put("/v1/files/archive", params={"path": "dest"}, content=_tar(members, gzip=gzip))
    assert up.status_code == 200
    assert up.json()["files"] == 3
    assert (agent.root / "dest/repo/src/main.py").read_text() == "print(1)\n"
    assert os.access(agent.root / "dest/repo/run.sh", os.X_OK)

    down = agent.client.get("/v1/files/archive", params={"path": "dest/repo", "gzip": "1" if gzip else "0"})
    assert down.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(down.content), mode="r:*") as tar:
        names = sorted(member.name for member in tar.getmembers() if member.isfile())
        assert names == ["README", "run.sh", "src/main.py"]
        extracted = tar.extractfile("src/main.py")
        assert extracted is not None
        assert extracted.read() == b"print(1)\n"


@pytest.mark.parametrize(
    "member",
    [
        tarfile.TarInfo("../evil.txt"),
        tarfile.TarInfo("/etc/evil.txt"),
    ],
)
def test_unsafe_archive_members_are_refused(agent: Agent, member: tarfile.TarInfo) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        member.size = 1
        tar.addfile(member, io.BytesIO(b"x"))
    response = agent.client.put("/v1/files/archive", params={"path": "dest"}, content=buffer.getvalue())
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "unsafe_archive"
    assert not (agent.root.parent / "evil.txt").exists()


def test_archive_symlink_escape_is_refused(agent: Agent) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        link = tarfile.TarInfo("up")
        link.type = tarfile.SYMTYPE
        link.linkname = "../../.."
        tar.addfile(link)
        follow = tarfile.TarInfo("up/evil.txt")
        follow.size = 1
        tar.addfile(follow, io.BytesIO(b"x"))
    response = agent.client.put("/v1/files/archive", params={"path": "dest"}, content=buffer.getvalue())
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "unsafe_archive"


def test_archive_that_is_not_a_tar(agent: Agent) -> None:
    response = agent.client.put(
        "/v1/files/archive", params={"path": "dest"}, content=b"not a tar at all" * 100
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "bad_archive"


def test_a_file_where_a_directory_is_expected_is_a_clear_error(agent: Agent) -> None:
    (agent.root / "plain").write_text("x")
    response = agent.client.put("/v1/files", params={"path": "plain/child.txt"}, content=b"x")
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "not_a_directory"
    upload = agent.client.put("/v1/files/archive", params={"path": "plain"}, content=_tar({"a": b"1"}))
    assert upload.status_code == 422
    assert upload.json()["error"]["code"] in {"not_a_directory", "os_error"}


def _links_archive(entries: list[tuple[str, str | None]]) -> bytes:
    """A tar of (name, link target) entries; a None target makes a one-byte file."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, target in entries:
            info = tarfile.TarInfo(name)
            if target is None:
                info.size = 1
                tar.addfile(info, io.BytesIO(b"x"))
            else:
                info.type = tarfile.SYMTYPE
                info.linkname = target
                tar.addfile(info)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "entries",
    [
        # Each link is inside when made; the later one turns the earlier one outward.
        [("esc", "a/../.."), ("a", ".")],
        [("esc", "a/../.."), ("a", "."), ("esc/escaped.txt", None)],
        [("esc", "a/b/../../.."), ("a", "."), ("a/b", ".")],
        [("a", "."), ("esc", "a/../..")],
        [("d", "."), ("d/up", "../.."), ("up/escaped.txt", None)],
    ],
)
def test_archive_links_that_resolve_outside_in_any_order_are_refused(
    agent: Agent, entries: list[tuple[str, str | None]]
) -> None:
    (agent.root / "sub").mkdir()
    response = agent.client.put("/v1/files/archive", params={"path": "sub"}, content=_links_archive(entries))
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "unsafe_archive"
    assert "resolves outside the working area" in response.json()["error"]["message"]
    assert not (agent.root.parent / "escaped.txt").exists()
    for path in (agent.root / "sub").rglob("*"):
        assert os.path.realpath(path).startswith(str(agent.root.resolve())), f"{path} escapes"


def test_archive_links_that_stay_inside_are_kept(agent: Agent) -> None:
    entries: list[tuple[str, str | None]] = [("lib/a.txt", None), ("link", "lib/../lib"), ("up", "..")]
    response = agent.client.put("/v1/files/archive", params={"path": "sub"}, content=_links_archive(entries))
    assert response.status_code == 200, response.text
    assert (agent.root / "sub/link/a.txt").read_bytes() == b"x"


def test_a_directory_swapped_for_a_link_is_never_written_through(tmp_path: Path) -> None:
    from sandfleet_agent.errors import AgentError
    from sandfleet_agent.paths import Workspace

    root, outside = tmp_path / "ws", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    workspace = Workspace(root)
    resolved = workspace.resolve("d/sub")  # resolved while d does not exist yet
    (root / "d").symlink_to(outside)  # then a command puts a link there
    with pytest.raises(AgentError) as refused:
        workspace.open_dir(resolved, create=True)
    assert (refused.value.status, refused.value.code) == (409, "path_changed")
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("gzip", [False, True])
def test_the_common_tar_dot_shape_unpacks(agent: Agent, tmp_path: Path, gzip: bool) -> None:
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "a.py").write_text("A = 1\n")
    (source / "pkg" / "b.py").write_text("B = 2\n")
    # The shape users reach for first: members `./`, `./a.py`, `./pkg/`, made by the real tar.
    made = subprocess.run(
        ["tar", "-C", str(source), "-czf" if gzip else "-cf", "-", "."], capture_output=True, check=True
    )
    with tarfile.open(fileobj=io.BytesIO(made.stdout), mode="r:*") as tar:
        assert "." in {os.path.normpath(name) for name in tar.getnames()}
    for where in ("", "dest"):
        response = agent.client.put("/v1/files/archive", params={"path": where}, content=made.stdout)
        assert response.status_code == 200, response.text
        assert response.json()["files"] == 2
        assert (agent.root / where / "a.py").read_text() == "A = 1\n"
        assert (agent.root / where / "pkg" / "b.py").read_text() == "B = 2\n"


@pytest.mark.parametrize("kind", [tarfile.REGTYPE, tarfile.SYMTYPE])
def test_a_dot_member_that_is_not_a_directory_is_refused(agent: Agent, kind: bytes) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        member = tarfile.TarInfo("./")
        member.type = kind
        member.linkname = "/etc" if kind == tarfile.SYMTYPE else ""
        tar.addfile(member, io.BytesIO(b""))
    response = agent.client.put("/v1/files/archive", params={"path": "dest"}, content=buffer.getvalue())
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "unsafe_archive"
    assert not (agent.root / "dest").is_symlink()
