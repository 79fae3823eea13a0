"""The agent's part in a reset: a rekey only the current token's holder can make, and the probe's readings."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.agent.conftest import Agent, start_agent, stop_agent

GOLDEN = "g" * 40
OWN = "o" * 40


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator[Agent]:
    token_file = tmp_path / "token"
    token_file.write_text(GOLDEN)
    running = start_agent(tmp_path, "--token-file", str(token_file))
    yield running
    stop_agent(running)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_rekey_replaces_the_token_and_the_old_one_stops_working(keyed: Agent) -> None:
    assert keyed.client.post("/v1/rekey", json={"token": OWN}).status_code == 401
    assert keyed.client.post("/v1/rekey", json={"token": OWN}, headers=bearer("x" * 40)).status_code == 401
    assert keyed.client.post("/v1/rekey", json={"token": OWN}, headers=bearer(GOLDEN)).json() == {
        "rekeyed": True
    }
    assert keyed.client.post("/v1/exec", json={"argv": ["true"]}, headers=bearer(GOLDEN)).status_code == 401
    assert keyed.client.post("/v1/exec", json={"argv": ["true"]}, headers=bearer(OWN)).status_code == 200
    # Whoever held the golden token cannot take the agent back.
    assert keyed.client.post("/v1/rekey", json={"token": GOLDEN}, headers=bearer(GOLDEN)).status_code == 401


@pytest.mark.parametrize("token", [None, 7, "short", "s" * 20 + " " + "s" * 20, "é" * 40])
def test_a_weak_or_malformed_token_is_refused_with_a_reason(keyed: Agent, token: object) -> None:
    refused = keyed.client.post("/v1/rekey", json={"token": token}, headers=bearer(GOLDEN))
    assert refused.status_code == 400
    assert "token must" in refused.json()["error"]["message"]
    assert keyed.client.post("/v1/exec", json={"argv": ["true"]}, headers=bearer(GOLDEN)).status_code == 200


def test_the_probe_reads_processes_sockets_and_digests_of_roots(keyed: Agent) -> None:
    root = keyed.root
    probe = keyed.client.post(
        "/v1/probe", json={"roots": [str(root), "/nonexistent"]}, headers=bearer(GOLDEN)
    )
    assert probe.status_code == 200
    first = probe.json()
    assert any(p["pid"] == keyed.proc.pid for p in first["processes"])
    port = int(keyed.url.rsplit(":", 1)[1])
    assert {"proto": "tcp", "local_port": port, "remote_port": 0, "state": "0A"} in first["sockets"]
    assert first["files"]["/nonexistent"] == "absent"

    (root / "marker").write_text("episode")
    again = keyed.client.post("/v1/probe", json={"roots": [str(root)]}, headers=bearer(GOLDEN)).json()
    assert again["files"][str(root)] != first["files"][str(root)]
    (root / "marker").unlink()


@pytest.mark.parametrize("roots", ["/tmp", ["relative"], [1], ["/a"] * 65])
def test_probe_roots_are_validated(keyed: Agent, roots: object) -> None:
    refused = keyed.client.post("/v1/probe", json={"roots": roots}, headers=bearer(GOLDEN))
    assert refused.status_code == 400
    assert "absolute paths" in refused.json()["error"]["message"]


def test_a_call_of_another_episode_than_the_sandboxs_is_refused(keyed: Agent) -> None:
    # A fresh sandbox is in episode 0 (a caller that names none means 0); its gateway names the
    # lease's episode on every call, and only a reset moves the sandbox on (tests/e2e/local).
    exec_body = {"argv": ["true"]}
    assert keyed.client.post("/v1/exec", json=exec_body, headers=bearer(GOLDEN)).status_code == 200
    current = {**bearer(GOLDEN), "X-Sandfleet-Episode": "0"}
    assert keyed.client.post("/v1/exec", json=exec_body, headers=current).status_code == 200
    for other in ("1", "-1", "zero"):
        refused = keyed.client.post(
            "/v1/exec", json=exec_body, headers={**bearer(GOLDEN), "X-Sandfleet-Episode": other}
        )
        assert refused.status_code == 410
        assert refused.json()["error"]["code"] == "episode_ended"
    # Health and readiness answer whatever the episode: the kubelet names none.
    assert keyed.client.get("/v1/ready", headers={"X-Sandfleet-Episode": "9"}).status_code == 200


def test_a_reset_is_refused_unless_the_agent_was_started_for_it(keyed: Agent) -> None:
    # Started without --pristine-dir (and running commands as itself): nothing to reset to.
    refused = keyed.client.post("/v1/reset", headers=bearer(GOLDEN))
    assert refused.status_code == 409
    assert "--pristine-dir" in refused.json()["error"]["message"]
    assert keyed.client.post("/v1/reset").status_code == 401


def test_restore_puts_every_root_back_as_captured_without_following_links(tmp_path: Path) -> None:
    from sandfleet_agent import reset
    from sandfleet_agent.probe import tree_digest

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not ours")
    root = tmp_path / "workspace"
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.py").write_text("print(1)\n")
    (root / "link").symlink_to("src/main.py")
    os.chmod(root / "src" / "main.py", 0o640)
    pristine = tmp_path / "pristine"
    reset.capture((root, tmp_path / "missing"), pristine)
    before = tree_digest(root)
    assert stat.S_IMODE(os.stat(pristine).st_mode) == 0o700

    # An episode: edits, new files, a fifo, links out of the root, a deleted file.
    (root / "src" / "main.py").write_text("print(2)\n")
    (root / "new").mkdir()
    (root / "new" / "deep").write_text("x")
    os.mkfifo(root / "fifo")
    (root / "escape").symlink_to(outside)
    (root / "link").unlink()
    assert tree_digest(root) != before
    reset.restore((root, tmp_path / "missing"), pristine)
    assert tree_digest(root) == before
    assert (outside / "keep").read_text() == "not ours"  # nothing followed out of the root
