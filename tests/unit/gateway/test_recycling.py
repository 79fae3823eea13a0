"""The verdict on an agent's answer to a reset: clean, traces of the episode, a failure, or already done."""

from __future__ import annotations

from typing import Any

from sandfleet.gateway.recycling import judge

AGENT_PORT = 8000


def fingerprint(processes: list[tuple[int, int, str]], files: dict[str, str]) -> dict[str, Any]:
    return {
        "processes": [{"pid": p, "uid": u, "cmdline": c} for p, u, c in processes],
        "sockets": [{"proto": "tcp", "local_port": AGENT_PORT, "remote_port": 0, "state": "0A"}],
        "files": files,
    }


GOLDEN = fingerprint([(1, 0, "python3 -m sandfleet_agent")], {"/workspace": "d1", "/tmp": "d2"})


def answer(probe: dict[str, Any], golden: dict[str, Any] | None = GOLDEN) -> dict[str, Any]:
    return {"reset": True, "episode": 1, "kill_s": 0.01, "restore_s": 0.02, "probe": probe, "golden": golden}


def test_a_reset_whose_probe_matches_the_agents_own_golden_probe_is_clean() -> None:
    result = judge(200, answer(GOLDEN), AGENT_PORT, 0.05)
    assert result.clean
    assert result.outcome == "recycled"
    assert result.seconds == 0.05


def test_what_the_episode_left_behind_keeps_the_sandbox_from_its_run() -> None:
    dirty = fingerprint(
        [(1, 0, "python3 -m sandfleet_agent"), (40, 1000, "sleep 999")], {"/workspace": "d1", "/tmp": "x"}
    )
    result = judge(200, answer(dirty), AGENT_PORT, 0.05)
    assert not result.clean
    assert result.outcome == "probe_failed"
    assert any("sleep 999" in p for p in result.problems)
    assert any("/tmp differs" in p for p in result.problems)


def test_a_failed_or_unprovable_reset_is_never_clean() -> None:
    failed = judge(503, {"error": {"code": "reset_failed", "message": "processes [7] survived"}}, 8000, 1.0)
    assert failed.outcome == "reset_failed"
    assert "survived" in failed.problems[0]
    assert judge(200, answer(GOLDEN, golden=None), AGENT_PORT, 0.1).outcome == "reset_failed"
    assert judge(200, answer({"processes": "?"}), AGENT_PORT, 0.1).outcome == "reset_failed"
    assert judge(200, None, AGENT_PORT, 0.1).outcome == "reset_failed"
    refused = judge(409, {"error": {"code": "reset_not_enabled", "message": "no pristine"}}, 8000, 0.0)
    assert not refused.clean
    assert not refused.already_reset


def test_a_sandbox_another_gateway_reset_first_is_left_to_it() -> None:
    result = judge(409, {"error": {"code": "episode_already_reset", "message": "in 1"}}, AGENT_PORT, 0.0)
    assert result.already_reset
    assert not result.clean
    assert not result.problems
