"""Evaluate through the agent: patch, tests, reward (exit code or Harbor reward file), per-test results."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet_agent.evaluate import CANNOT_RUN, outcome_of, parse_junit, prepare_episode_logs, read_reward
from sandfleet_agent.users import Identity
from tests.support.pytest_summary import ANSI, MIXED_TESTS, summary_counts
from tests.unit.agent.conftest import Agent

BUGGY = "def add(a, b):\n    return a - b\n"
PATCH = """--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""
TEST_SCRIPT = "python3 -c 'import calc; assert calc.add(2, 3) == 5'"


def _repo(root: Path) -> None:
    (root / "calc.py").write_text(BUGGY)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)


def test_patch_fixes_the_bug_and_earns_the_reward(agent: Agent) -> None:
    _repo(agent.root)
    before = agent.client.post("/v1/evaluate", json={"shell": TEST_SCRIPT}).json()
    assert before["reward"] == 0.0
    assert before["reward_source"] == "exit_code"
    after = agent.client.post("/v1/evaluate", json={"patch": PATCH, "shell": TEST_SCRIPT}).json()
    assert after["patch"] == {"applied": True, "files": ["calc.py"]}
    assert after["reward"] == 1.0
    assert after["exec"]["exit_code"] == 0
    assert set(after["durations"]) == {"patch_s", "tests_s", "total_s"}
    assert "return a + b" in (agent.root / "calc.py").read_text()


def test_patch_applies_outside_a_git_repository(agent: Agent) -> None:
    (agent.root / "calc.py").write_text(BUGGY)
    result = agent.client.post("/v1/evaluate", json={"patch": PATCH, "shell": TEST_SCRIPT}).json()
    assert result["reward"] == 1.0


def test_bad_patch_is_refused_and_leaves_the_tree_alone(agent: Agent) -> None:
    _repo(agent.root)
    wrong = PATCH.replace("return a - b", "return a * b")
    response = agent.client.post("/v1/evaluate", json={"patch": wrong, "shell": "true"})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "bad_patch"
    assert "calc.py" in error["message"]
    assert (agent.root / "calc.py").read_text() == BUGGY
    garbage = agent.client.post("/v1/evaluate", json={"patch": "this is not a diff", "shell": "true"})
    assert garbage.status_code == 422
    assert garbage.json()["error"]["code"] == "bad_patch"


def test_harbor_convention_reward_file_wins_over_exit_code(agent: Agent) -> None:
    tests = agent.root / "tests"
    tests.mkdir()
    (tests / "test.sh").write_text('echo 0.25 > "$SANDFLEET_VERIFIER_DIR/reward.txt"\nexit 1\n')
    result = agent.client.post("/v1/evaluate", json={}).json()
    assert result["reward"] == 0.25
    assert result["reward_source"] == "reward_file"
    assert result["exec"]["argv"] == ["bash", "tests/test.sh"]
    assert (agent.logs / "verifier" / "reward.txt").read_text().strip() == "0.25"


def test_stale_reward_is_cleared_before_the_run(agent: Agent) -> None:
    verifier = agent.logs / "verifier"
    verifier.mkdir(parents=True)
    (verifier / "reward.txt").write_text("1.0")
    result = agent.client.post("/v1/evaluate", json={"shell": "exit 1"}).json()
    assert result["reward"] == 0.0
    assert result["reward_source"] == "exit_code"


def test_no_test_command_is_a_clear_error(agent: Agent) -> None:
    response = agent.client.post("/v1/evaluate", json={})
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "no_test_command"


def test_per_test_counts_come_from_the_verifiers_junit_report_not_from_output(agent: Agent) -> None:
    fake = "tests/t.py::test_a PASSED\\nPASSED tests/t.py::test_b\\n"
    printed = agent.client.post("/v1/evaluate", json={"shell": f"printf '{fake}'; exit 1"}).json()
    assert printed["tests"] == []
    assert printed["counts"] == {"passed": 0, "failed": 0, "error": 0, "skipped": 0, "xfailed": 0}
    assert printed["tests_report"] is None
    junit = (
        '<testsuite><testcase classname="m" name="ok" time="0.5"/>'
        '<testcase classname="m" name="bad"><failure message="x"/></testcase></testsuite>'
    )
    (agent.root / "report.xml").write_text(junit)
    planted = agent.client.post("/v1/evaluate", json={"shell": "true", "junit_xml": "report.xml"}).json()
    assert planted["tests"] == [], "a report in the working area is the episode's, not the verifier's"
    written = agent.client.post(
        "/v1/evaluate",
        json={"shell": 'cp report.xml "$SANDFLEET_VERIFIER_DIR/report.xml"', "junit_xml": "report.xml"},
    ).json()
    assert written["tests"] == [
        {"name": "m::ok", "outcome": "passed", "duration_s": 0.5},
        {"name": "m::bad", "outcome": "failed"},
    ]
    assert written["counts"] == {"passed": 1, "failed": 1, "error": 0, "skipped": 0, "xfailed": 0}


def test_pytest_is_told_to_write_the_junit_report_into_the_verifier_dir(agent: Agent) -> None:
    result = agent.client.post(
        "/v1/evaluate", json={"shell": 'echo "$PYTEST_ADDOPTS"', "env": {"PYTEST_ADDOPTS": "-x"}}
    ).json()
    addopts = result["exec"]["stdout_tail"].split()
    assert addopts[0] == "-x"
    assert f"--junitxml={agent.logs / 'verifier' / 'junit.xml'}" in addopts
    assert addopts[-2:] == ["-p", "no:cacheprovider"]


def test_a_spoiled_junit_report_gives_no_counts_and_no_error(agent: Agent) -> None:
    result = agent.client.post(
        "/v1/evaluate", json={"shell": 'echo "<testsuite" > "$SANDFLEET_VERIFIER_DIR/junit.xml"'}
    ).json()
    assert result["tests"] == []
    assert "not valid XML" in result["tests_error"]
    linked = agent.client.post(
        "/v1/evaluate", json={"shell": 'ln -s /etc/hostname "$SANDFLEET_VERIFIER_DIR/reward.txt"'}
    ).json()
    assert (linked["reward"], linked["reward_error"]) == (0.0, "reward.txt is not a regular file")


@pytest.mark.parametrize(
    ("files", "exit_code", "expected"),
    [
        ({}, 0, (1.0, "exit_code", None)),
        ({}, 2, (0.0, "exit_code", None)),
        ({"reward.txt": "0.75\n"}, 1, (0.75, "reward_file", None)),
        ({"reward.json": '{"reward": 0.5, "tests": 3}'}, 1, (0.5, "reward_file", None)),
        ({"reward.json": "0.3"}, 0, (0.3, "reward_file", None)),
    ],
)
def test_read_reward(
    tmp_path: Path, files: dict[str, str], exit_code: int, expected: tuple[float, str, None]
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert read_reward(tmp_path, exit_code) == expected


@pytest.mark.parametrize(
    ("name", "text"), [("reward.txt", "lots"), ("reward.txt", "nan"), ("reward.json", "{")]
)
def test_unreadable_reward_gives_zero_and_says_why(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(text)
    reward, source, problem = read_reward(tmp_path, 0)
    assert (reward, source) == (0.0, "reward_file")
    assert problem


def test_parse_junit_errors_and_skips(tmp_path: Path) -> None:
    report = tmp_path / "r.xml"
    report.write_text(
        '<testsuites><testsuite><testcase name="e"><error/></testcase>'
        '<testcase name="s"><skipped/></testcase></testsuite></testsuites>'
    )
    assert parse_junit(report) == [{"name": "e", "outcome": "error"}, {"name": "s", "outcome": "skipped"}]


def test_counts_equal_what_pytest_itself_reports(agent: Agent) -> None:
    # Colour codes, `SKIPPED [3]`, xfail/xpass, setup and teardown errors, parametrized tests and
    # subtests, all in one real pytest run: the counts must be pytest's own, not a reading of its output.
    (agent.root / "test_mixed.py").write_text(MIXED_TESTS)
    result = agent.client.post(
        "/v1/evaluate",
        json={"argv": [sys.executable, "-m", "pytest", "--color=yes", "-rA", "test_mixed.py"]},
    ).json()
    output = result["exec"]["stdout_tail"]
    assert "\x1b[" in output
    assert "SKIPPED [3]" in ANSI.sub("", output)
    assert result["counts"] == summary_counts(output)
    assert result["outcome"] == "failed"
    assert result["reward"] == 0.0
    by_name = {test["name"]: test for test in result["tests"]}
    assert by_name["test_mixed::test_subtests"]["failures"] == 2 + 1  # two subtests, then the test itself
    assert by_name["test_mixed::test_xfail"]["outcome"] == "xfailed"


def test_a_missing_required_report_is_an_infra_error_not_a_zero(agent: Agent) -> None:
    plain = agent.client.post("/v1/evaluate", json={"shell": "exit 1"}).json()
    assert (plain["outcome"], plain["reward"]) == ("failed", 0.0)
    required = agent.client.post("/v1/evaluate", json={"shell": "exit 1", "require_report": True}).json()
    assert required["outcome"] == "infra_error"
    assert "JUnit" in required["outcome_reason"]
    refused = agent.client.post("/v1/evaluate", json={"shell": "true", "require_report": "yes"})
    assert refused.status_code == 400


def test_outcomes_through_the_agent(agent: Agent) -> None:
    passed = agent.client.post("/v1/evaluate", json={"shell": "true"}).json()
    assert (passed["outcome"], passed["reward"]) == ("passed", 1.0)
    slow = agent.client.post("/v1/evaluate", json={"shell": "sleep 30", "timeout_s": 0.5}).json()
    assert (slow["outcome"], slow["reward"]) == ("timed_out", 0.0)
    missing = agent.client.post("/v1/evaluate", json={"shell": "no-such-test-runner"}).json()
    assert (missing["outcome"], missing["exec"]["exit_code"]) == ("infra_error", 127)


@given(
    reward=st.floats(allow_nan=False, allow_infinity=False),
    source=st.sampled_from(["reward_file", "exit_code"]),
    exit_code=st.none() | st.integers(min_value=0, max_value=255),
    timed_out=st.booleans(),
    required=st.booleans(),
    found=st.booleans(),
)
def test_outcome_rule(
    reward: float, source: str, exit_code: int | None, timed_out: bool, required: bool, found: bool
) -> None:
    outcome, reason = outcome_of(
        reward=reward,
        reward_source=source,
        exit_code=exit_code,
        timed_out=timed_out,
        report_required=required,
        report_found=found,
    )
    cannot_run = source == "exit_code" and exit_code in CANNOT_RUN
    if cannot_run or (required and not found):
        assert outcome == "infra_error"
        assert reason
    elif timed_out:
        assert outcome == "timed_out"
        assert reason
    else:
        assert outcome == ("passed" if reward >= 1.0 else "failed")
        assert reason is None


def test_harbors_episode_log_directories_are_the_commands_users_and_logs_stays_roots(tmp_path: Path) -> None:
    # A Harbor trial's oracle writes /logs/agent/oracle.txt as the episode's user; /logs itself, and
    # the verifier's directory in it, are not the episode's to change.
    user = Identity(uid=4242, gid=4243, home="/home/x")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    logs = tmp_path / "logs"
    logs.symlink_to(elsewhere)  # a link where <logs> goes is replaced, never followed
    (elsewhere / "agent").mkdir()
    prepare_episode_logs(logs, user)
    assert not logs.is_symlink()
    assert logs.is_dir()
    assert (logs.stat().st_uid, logs.stat().st_mode & 0o777) == (os.geteuid(), 0o755)
    for name in ("agent", "artifacts"):
        info = (logs / name).lstat()
        assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (4242, 4243, 0o755)
    assert (elsewhere / "agent").stat().st_uid == os.geteuid()  # the link's target was left alone
    assert not (logs / "verifier").exists()  # evaluate makes it the verifier's, each time
