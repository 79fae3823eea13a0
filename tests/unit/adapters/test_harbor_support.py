"""The Harbor environment's pure decisions: who runs a command, what its result says, tars both ways."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from sandfleet.adapters.harbor_support import (
    Route,
    SharedVerifierError,
    UnsupportedUserError,
    exit_code,
    is_separate_verifier,
    log_dirs_command,
    pack_dir,
    read_command,
    refuse_tests_in_episode,
    root_route,
    route,
    runs_as_root,
    unpack_into,
    verifier_output,
    write_command,
)


@pytest.mark.parametrize(
    ("user", "expected"), [(None, Route.SANDBOX), ("sandbox", Route.SANDBOX), (1000, Route.SANDBOX)]
)
def test_the_episodes_commands_run_as_the_sandbox_user(user: str | int | None, expected: Route) -> None:
    assert route(user) is expected


@pytest.mark.parametrize("user", ["root", 0, "verifier", 1001])
def test_root_and_verifier_commands_go_to_the_verifier(user: str | int) -> None:
    assert route(user) is Route.VERIFIER


@pytest.mark.parametrize("user", ["agent", "nobody", 65534])
def test_other_users_are_refused_in_one_line(user: str | int) -> None:
    with pytest.raises(UnsupportedUserError, match=f"not {user!r}"):
        route(user)


@pytest.mark.parametrize(
    ("code", "timed_out", "expected"),
    [(0, False, 0), (3, False, 3), (None, False, -1), (0, True, 124), ("1", False, -1)],
)
def test_exit_code(code: object, timed_out: bool, expected: int) -> None:
    assert exit_code(code, timed_out) == expected


def test_verifier_output_reads_the_evaluate_report() -> None:
    report: dict[str, Any] = {
        "reward": 1.0,
        "exec": {"exit_code": 2, "timed_out": False, "stdout_tail": "out", "stderr_tail": "err"},
    }
    assert verifier_output(report) == ("out", "err", 2)
    assert verifier_output({"exec": {"exit_code": None, "timed_out": True}}) == ("", "", 124)
    assert verifier_output({}) == ("", "", -1)


def test_pack_then_unpack_keeps_contents_and_modes(tmp_path: Path) -> None:
    source = tmp_path / "tests"
    (source / "data").mkdir(parents=True)
    (source / "test.sh").write_text("#!/bin/bash\nexit 0\n")
    (source / "test.sh").chmod(0o755)
    (source / "data" / "case.txt").write_text("x")
    names = unpack_into(pack_dir(source), tmp_path / "out")
    assert sorted(names) == ["data", "data/case.txt", "test.sh"]
    assert (tmp_path / "out" / "data" / "case.txt").read_text() == "x"
    assert os.stat(tmp_path / "out" / "test.sh").st_mode & 0o777 == 0o755


def test_pack_refuses_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError):
        pack_dir(tmp_path / "f")


def _tar(*members: tarfile.TarInfo) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for member in members:
            tar.addfile(member, io.BytesIO(b"x" * member.size) if member.isreg() else None)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, linkname, 1 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize(
    "member",
    [
        _member("../escape"),
        _member("a/../../escape"),
        _member("link", tarfile.SYMTYPE, "/etc/passwd"),
        _member("link", tarfile.SYMTYPE, "../../escape"),
        _member("dev", tarfile.CHRTYPE),
    ],
)
def test_a_hostile_archive_from_the_sandbox_lands_nothing_outside(
    tmp_path: Path, member: tarfile.TarInfo
) -> None:
    target = tmp_path / "a" / "b"
    with pytest.raises(tarfile.TarError):
        unpack_into(_tar(member), target)
    assert not (tmp_path / "escape").exists()
    assert not (tmp_path / "a" / "escape").exists()


def test_a_pool_runs_as_root_when_id_says_0() -> None:
    assert runs_as_root("0\n") is True
    assert runs_as_root("1000\n") is False
    assert runs_as_root("") is False


def test_harbors_separate_verifier_is_told_by_its_session_id() -> None:
    assert is_separate_verifier("hello-app__ReKTjdQ__verifier__trial") is True
    assert is_separate_verifier("hello-app__ReKTjdQ") is False


@pytest.mark.parametrize("user", [None, "root", 0])
def test_on_a_root_pool_root_commands_are_execs(user: str | int | None) -> None:
    assert root_route(user) is Route.SANDBOX


@pytest.mark.parametrize("user", ["verifier", "sandbox", 1000])
def test_on_a_root_pool_another_user_is_refused_rather_than_run_as_root(user: str | int) -> None:
    with pytest.raises(UnsupportedUserError, match=f"every command as root, not as {user!r}"):
        root_route(user)


@pytest.mark.parametrize("target", ["/tests", "/tests/", "tests", "/tests/test.sh", "//tests/x"])
def test_a_root_episode_refuses_harbors_tests(target: str) -> None:
    with pytest.raises(SharedVerifierError, match='environment_mode = "separate"'):
        refuse_tests_in_episode(target)


@pytest.mark.parametrize("target", ["/solution", "/logs/agent", "/app/tests", "/testsuite"])
def test_a_root_episode_takes_everything_else(target: str) -> None:
    refuse_tests_in_episode(target)


def test_the_log_directories_are_harbors() -> None:
    assert log_dirs_command() == "mkdir -p /logs/agent /logs/verifier /logs/artifacts"


def test_files_outside_the_routes_move_as_base64_through_a_root_shell_quoted() -> None:
    assert read_command("/var/tmp/a b.log", directory=False) == "base64 < '/var/tmp/a b.log'"
    assert read_command("/opt/out", directory=True) == "tar -C /opt/out -czf - . | base64"
    assert write_command("/var/tmp/x;rm", directory=False) == (
        "mkdir -p -- /var/tmp && base64 -d > '/var/tmp/x;rm'"
    )
    assert write_command("/top", directory=False) == "mkdir -p -- / && base64 -d > /top"
    assert write_command("/opt/in", directory=True) == (
        "mkdir -p -- /opt/in && base64 -d | tar --no-same-owner -xzf - -C /opt/in"
    )
