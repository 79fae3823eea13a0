"""The client commands' pure parts: what `exec` tells stderr, and the tar `files put` sends."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from sandfleet.cli.client_commands import EVALUATE_EXIT, exec_notes, tar_of
from sandfleet.wire import Outcome


def test_exec_says_when_output_was_cut_or_the_command_timed_out() -> None:
    assert exec_notes({"exit_code": 0, "stdout_truncated": False, "timed_out": False}, None) == []
    cut = exec_notes({"stdout_truncated": True, "stdout_bytes": 5000, "stderr_truncated": True}, 10)
    assert cut[0].startswith("sandfleet: stdout truncated at 10 bytes (5000 bytes produced)")
    assert cut[1].startswith("sandfleet: stderr truncated")
    (late,) = exec_notes({"timed_out": True, "duration_s": 1.02}, None)
    assert "timed out after 1.02s" in late


def test_a_directory_goes_as_tar_dot(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("x = 1\n")
    with tarfile.open(fileobj=io.BytesIO(tar_of(tmp_path)), mode="r:gz") as tar:
        names = tar.getnames()
    assert names == [".", "./pkg", "./pkg/m.py"]


def test_every_outcome_has_its_exit_status() -> None:
    assert set(EVALUATE_EXIT) == set(Outcome)
    assert {str(outcome): status for outcome, status in EVALUATE_EXIT.items()} == {
        "passed": 0,
        "failed": 1,
        "timed_out": 124,
        "infra_error": 3,
    }
    assert len(set(EVALUATE_EXIT.values())) == len(EVALUATE_EXIT)
