"""Harbor's directories through the agent: /tests, /logs and /solution open, everything else still closed."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.agent.conftest import Agent, start_agent, stop_agent


@pytest.fixture
def harbor_agent(tmp_path: Path) -> Iterator[Agent]:
    """An agent whose extra roots are a `tests` and a `logs` directory beside its working area."""
    (tmp_path / "logs" / "verifier").mkdir(parents=True)
    running = start_agent(
        tmp_path, "--extra-root", str(tmp_path / "tests"), "--extra-root", str(tmp_path / "logs")
    )
    yield running
    stop_agent(running)


def _tar(members: dict[str, bytes], mode: int = 0o755) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(content), mode
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def test_tests_dir_is_made_on_first_write_and_read_back(harbor_agent: Agent, tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    assert not tests.exists()
    script = f"{tests}/test.sh"
    written = harbor_agent.client.put(
        "/v1/files", params={"path": script, "mode": "0755"}, content=b"exit 0\n"
    )
    assert written.status_code == 200, written.text
    assert written.json()["path"] == script  # absolute, as the client named it
    assert (tests / "test.sh").read_bytes() == b"exit 0\n"
    assert harbor_agent.client.get("/v1/files", params={"path": script}).content == b"exit 0\n"
    listing = harbor_agent.client.get("/v1/files/list", params={"path": str(tests)}).json()
    assert [entry["path"] for entry in listing["entries"]] == [script]


def test_archive_upload_into_tests_and_download_of_logs(harbor_agent: Agent, tmp_path: Path) -> None:
    tests, verifier = tmp_path / "tests", tmp_path / "logs" / "verifier"
    body = _tar({"test.sh": b"echo 1 > reward.txt\n", "data/case.txt": b"x"})
    up = harbor_agent.client.put("/v1/files/archive", params={"path": str(tests)}, content=body)
    assert up.status_code == 200, up.text
    assert up.json()["files"] == 2
    assert (tests / "data" / "case.txt").read_bytes() == b"x"
    assert os.stat(tests / "test.sh").st_mode & 0o777 == 0o755
    (verifier / "reward.json").write_text('{"reward": 1}')
    down = harbor_agent.client.get("/v1/files/archive", params={"path": str(verifier), "gzip": "1"})
    assert down.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(down.content), mode="r:gz") as tar:
        assert tar.getnames() == ["reward.json"]


def test_set_id_bits_are_dropped_outside_the_working_area(harbor_agent: Agent, tmp_path: Path) -> None:
    path = f"{tmp_path}/tests/suid"
    response = harbor_agent.client.put("/v1/files", params={"path": path, "mode": "4755"}, content=b"x")
    assert response.status_code == 200, response.text
    assert os.stat(path).st_mode & 0o7777 == 0o755
    inside = harbor_agent.client.put("/v1/files", params={"path": "suid", "mode": "4755"}, content=b"x")
    assert inside.status_code == 200
    assert os.stat(harbor_agent.root / "suid").st_mode & 0o7777 == 0o4755


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "/proc/self/environ", "/tmp/x", "{tmp}/tests/../secret.txt", "{tmp}/testsx/a", "{tmp}/t"],
)
def test_everything_else_is_still_refused(harbor_agent: Agent, tmp_path: Path, path: str) -> None:
    (tmp_path / "secret.txt").write_text("secret")
    path = path.format(tmp=tmp_path)
    for response in (
        harbor_agent.client.get("/v1/files", params={"path": path}),
        harbor_agent.client.put("/v1/files", params={"path": path}, content=b"x"),
        harbor_agent.client.get("/v1/files/list", params={"path": path}),
    ):
        assert response.status_code == 403, (path, response.text)
        assert response.json()["error"]["code"] == "path_outside_root"
    assert (tmp_path / "secret.txt").read_text() == "secret"


def test_symlinks_out_of_an_extra_root_are_refused(harbor_agent: Agent, tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tmp_path / "secret.txt").write_text("secret")
    os.symlink(tmp_path / "secret.txt", tests / "escape")
    os.symlink("/etc", tests / "etc")
    assert harbor_agent.client.get("/v1/files", params={"path": f"{tests}/escape"}).status_code == 403
    write = harbor_agent.client.put("/v1/files", params={"path": f"{tests}/etc/evil"}, content=b"x")
    assert write.status_code == 403
    assert not Path("/etc/evil").exists()
    link = tarfile.TarInfo("out")
    link.type, link.linkname = tarfile.SYMTYPE, "../secret.txt"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.addfile(link)
    unsafe = harbor_agent.client.put(
        "/v1/files/archive", params={"path": str(tests)}, content=buffer.getvalue()
    )
    assert unsafe.json()["error"]["code"] == "unsafe_archive"
    assert not os.path.lexists(tests / "out")


def test_an_extra_root_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "tests")
    running = start_agent(tmp_path, "--extra-root", str(tmp_path / "tests"))
    try:
        write = running.client.put("/v1/files", params={"path": f"{tmp_path}/tests/a"}, content=b"x")
        assert write.status_code == 403
        assert not (tmp_path / "elsewhere" / "a").exists()
    finally:
        stop_agent(running)


def test_extra_roots_themselves_cannot_be_deleted_or_written(harbor_agent: Agent, tmp_path: Path) -> None:
    logs = str(tmp_path / "logs")
    # Its parent is outside every root, so the delete is refused before it is looked at.
    assert harbor_agent.client.delete("/v1/files", params={"path": logs, "recursive": "1"}).status_code == 403
    assert harbor_agent.client.put("/v1/files", params={"path": logs}, content=b"x").status_code == 422
    assert (tmp_path / "logs" / "verifier").is_dir()
