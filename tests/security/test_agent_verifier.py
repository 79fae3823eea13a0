"""Reward tampering under real gVisor: nothing of the sandbox user survives into the verifier run,
the verifier's directory is not the sandbox user's, and counts come only from the verifier's JUnit
report, never from lines the code prints."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.local.conftest import sh

pytestmark = pytest.mark.gvisor

# Left running by an episode's exec: it keeps trying to plant a perfect reward and fake counts
# wherever it can, in a loop that keeps forking so a single sweep cannot catch it.
TAMPER = r"""
cat > /tmp/tamper.sh <<'EOF'
while :; do
  for dir in /logs/verifier "$SANDFLEET_VERIFIER_DIR" /workspace; do
    echo 1.0 > "$dir/reward.txt" 2>/dev/null
    echo '<testsuite><testcase name="forged"/></testsuite>' > "$dir/junit.xml" 2>/dev/null
  done
  ( sleep 0.01 & )
done
EOF
( setsid sh /tmp/tamper.sh > /dev/null 2>&1 & ) ; ( setsid sh /tmp/tamper.sh > /dev/null 2>&1 & )
"""
FAILING_TESTS = (
    "echo 'PASSED tests/test_x.py::test_forged'; echo 'tests/test_x.py::test_also PASSED'; sleep 1; exit 1"
)


async def test_a_process_left_by_an_earlier_exec_cannot_forge_the_reward_or_the_counts(
    agent: httpx.AsyncClient,
) -> None:
    planted = await sh(agent, TAMPER)
    assert planted["exit_code"] == 0
    before = await sh(agent, "pgrep -u 1000 -f 'sh /tmp/[t]amper.sh' | wc -l")
    assert int(str(before["stdout"])) >= 2
    result = (await agent.post("/v1/evaluate", json={"shell": FAILING_TESTS})).json()
    assert (result["reward"], result["reward_source"]) == (0.0, "exit_code"), result
    assert result["tests"] == []
    assert result["counts"] == {"passed": 0, "failed": 0, "error": 0, "skipped": 0, "xfailed": 0}
    survivors = await sh(agent, "pgrep -u 1000 -f 'sh /tmp/[t]amper.sh' | wc -l")
    assert int(str(survivors["stdout"])) == 0


async def test_the_verifier_runs_as_its_own_user_in_a_directory_the_sandbox_user_cannot_write(
    agent: httpx.AsyncClient,
) -> None:
    write = await sh(agent, "touch /logs/verifier/x; touch /logs/x; ls -ld /logs /logs/verifier")
    assert write["stderr"].count("Permission denied") == 2, write
    script = (
        'id -u; id -g; echo "$HOME"; touch /workspace/verifier-was-here 2>/dev/null || echo ro; '
        'echo 0.5 > "$SANDFLEET_VERIFIER_DIR/reward.txt"; '
        'printf \'<testsuite><testcase classname="t" name="a"/><testcase classname="t" name="b">'
        '<failure/></testcase></testsuite>\' > "$SANDFLEET_VERIFIER_DIR/junit.xml"'
    )
    result = (await agent.post("/v1/evaluate", json={"shell": script})).json()
    assert result["exec"]["stdout_tail"].split() == ["1001", "1001", "/home/verifier", "ro"]
    assert (result["reward"], result["reward_source"]) == (0.5, "reward_file")
    assert result["counts"] == {"passed": 1, "failed": 1, "error": 0, "skipped": 0, "xfailed": 0}
    after = await sh(agent, "stat -c '%u %a' /logs/verifier; echo 1.0 > /logs/verifier/reward.txt")
    assert str(after["stdout"]).split() == ["1001", "755"]
    assert "Permission denied" in str(after["stderr"])
