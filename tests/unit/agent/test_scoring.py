"""The named-tests scorer on the host: a small project, the real verdict runner and pytest, every attack
that needs no users split (the gVisor suite, tests/e2e/local/test_reward_attacks.py, runs them all)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandfleet_agent import scoring
from sandfleet_agent.paths import Workspace
from tests.support.reward_attacks import ATTACKS, Attack, script

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = """\
import unittest

from pkg import add


class AddTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)


def test_zero():
    assert add(0, 0) == 0
"""
DECIDING = ["tests.test_add.AddTest::test_add", "tests.test_add::test_zero"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A pristine copy (root's, read-only to others) and an episode tree made from it."""
    pristine = tmp_path / "pristine"
    (pristine / "pkg").mkdir(parents=True)
    (pristine / "tests").mkdir()
    (pristine / "pkg" / "__init__.py").write_text(BUGGY)
    (pristine / "tests" / "__init__.py").write_text("")
    (pristine / "tests" / "test_add.py").write_text(TESTS)
    shutil.copytree(pristine, tmp_path / "episode")
    return tmp_path


def score(root: Path, timeout_s: float = 60) -> dict[str, object]:
    task = {
        "tree": "episode",
        "pristine": str(root / "pristine"),
        "deciding": DECIDING,
        "pytest_args": ["-q", "-p", "no:cacheprovider", "-p", "no:asyncio"],
        "python": sys.executable,
        "timeout_s": timeout_s,
    }
    spec = scoring.parse_task(task, Workspace(root))
    return scoring.score(spec, root / "logs" / "scoring", None, None)


def test_the_bug_scores_0_and_names_the_failing_test(project: Path) -> None:
    report = score(project)
    assert (report["outcome"], report["reward"]) == ("failed", 0.0)
    assert report["deciding"] == {
        "total": 2,
        "passed": 1,
        "not_passing": [{"name": DECIDING[0], "outcome": "failed"}],
    }
    assert report["tampered"] == []


def test_the_honest_fix_scores_1(project: Path) -> None:
    (project / "episode" / "pkg" / "__init__.py").write_text(FIXED)
    report = score(project)
    assert (report["outcome"], report["reward"]) == ("passed", 1.0), report["outcome_reason"]
    assert report["carried"] == {"changed": ["pkg/__init__.py"], "deleted": []}
    assert report["counts"] == {"passed": 2, "failed": 0, "error": 0, "skipped": 0, "xfailed": 0}


def test_an_edit_whose_time_is_put_back_is_not_carried_and_scores_the_pristine_file(project: Path) -> None:
    # Same size, same time as the pristine file: taken as unchanged without reading either copy.
    # The fix has the bug's size, so only the time tells them apart here; putting it back can only
    # keep the episode's own edit out of scoring.
    edited = project / "episode" / "pkg" / "__init__.py"
    pristine = os.stat(project / "pristine" / "pkg" / "__init__.py")
    edited.write_text(FIXED)
    os.utime(edited, ns=(pristine.st_atime_ns, pristine.st_mtime_ns))
    report = score(project)
    assert (report["outcome"], report["reward"]) == ("failed", 0.0), report["outcome_reason"]
    assert report["carried"] == {"changed": [], "deleted": []}


def test_a_suite_writing_into_its_tree_is_scored_as_its_project_runs_it(project: Path) -> None:
    # Coverage files, caches: the scoring tree is the verifier's to write (semver's .coverage).
    (project / "episode" / "pkg" / "__init__.py").write_text(FIXED)
    tests = project / "pristine" / "tests" / "test_add.py"
    tests.write_text(tests.read_text() + "\n\ndef test_writes():\n    open('.coverage', 'w').write('x')\n")
    shutil.copy(tests, project / "episode" / "tests" / "test_add.py")
    report = score(project)
    assert (report["outcome"], report["reward"]) == ("passed", 1.0), report["outcome_reason"]


HOST_ATTACKS = [attack for attack in ATTACKS if attack.host]


@pytest.mark.parametrize("attack", HOST_ATTACKS, ids=[a.name for a in HOST_ATTACKS])
def test_every_attack_from_the_episodes_edit_scores_0(project: Path, attack: Attack) -> None:
    program = script(attack, "pkg/__init__.py", "tests/test_add.py", FIXED, DECIDING)
    home = project / "home"  # what the attack writes "at home" stays in the test's directory
    home.mkdir()
    made = subprocess.run(
        [sys.executable, "-c", program],
        cwd=project / "episode",
        env={**os.environ, "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    report = score(project, timeout_s=8)
    assert (report["outcome"], report["reward"]) == (attack.outcome, 0.0), report["outcome_reason"]
    if attack.reported:
        assert report["tampered"], f"{attack.name} went unreported: {report['outcome_reason']}"
