"""Reading the users commands run as: root only by name, a home of the image's own, clear refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandfleet_agent.errors import AgentError
from sandfleet_agent.evaluate import Verification, evaluate
from sandfleet_agent.paths import Workspace
from sandfleet_agent.users import Identity, is_root, parse_identity
from sandfleet_agent.wire import SCORE_ELSEWHERE


def test_users_are_read_with_their_homes() -> None:
    assert parse_identity("none", "/home/sandbox") is None
    assert parse_identity("1000:1000", "/home/sandbox") == Identity(1000, 1000, "/home/sandbox")
    assert parse_identity("1001", "/home/sandbox") == Identity(1001, 1001, "/home/sandbox")
    assert parse_identity("1001:50:/home/app", "/home/sandbox") == Identity(1001, 50, "/home/app")
    assert parse_identity("root", "/home/sandbox") == Identity(0, 0, "/root")


@pytest.mark.parametrize("text", ["0:0", "0", "app", "1000:x", "1000:1000:relative", ""])
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"UID:GID|root only|absolute"):
        parse_identity(text, "/home/sandbox")


def test_only_root_is_root() -> None:
    assert is_root(Identity(0, 0, "/root"))
    assert not is_root(Identity(1000, 1000, "/h"))
    assert not is_root(None)


def test_an_agent_whose_commands_ran_as_root_refuses_to_score_in_place(tmp_path: Path) -> None:
    root = Identity(0, 0, "/root")
    ran = Verification(logs_dir=tmp_path / "logs", exec_user=root, commands_ran=True)
    for body in ({"shell": "true"}, {"task": {"tree": "."}}):
        with pytest.raises(AgentError) as refused:
            evaluate(body, Workspace(tmp_path), {"PATH": "/usr/bin:/bin"}, ran)
        assert refused.value.code == SCORE_ELSEWHERE
        assert "clean sandbox" in str(refused.value)
    # No command ran: the clean sandbox of another's episode scores (here: a bad task, refused as such).
    clean = Verification(logs_dir=tmp_path / "logs", exec_user=root)
    with pytest.raises(AgentError) as bad:
        evaluate({"task": {"tree": "."}}, Workspace(tmp_path), {"PATH": "/usr/bin:/bin"}, clean)
    assert bad.value.code == "bad_task"
