"""A real project's own configured test run under the named-tests rule: semver 3.1.2, built with `task build`.

semver's `.pytest.ini` asks for `--cov=semver` (coverage writes `.coverage` into the tree), doctests
of its modules and docs, and `pythonpath = src tests`. Scored as the command form used to score it
(as the verifier, in the sandbox user's /workspace), its honest tree was an `infra_error`
(".coverage: Permission denied"); scored by its named tests, the suite runs in a scoring tree the
verifier owns, as the project runs it: the clean tree and the fixed tree score 1, the bug 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandfleet.client import Fleet, Outcome
from sandfleet.local.tools import ImageRef
from tests.e2e.local.conftest import BUILD_TIMEOUT_S
from tests.support.servers import start_local_serve, stop_local_serve

pytestmark = pytest.mark.gvisor

TOKEN = "local-token"
MODULE = "/workspace/src/semver/version.py"
HONEST, BUG = "return cls(self._major + 1)", "return cls(self._major + 2)"
DECIDING = [
    "tests.test_bump::test_should_bump_major",
    "tests.test_bump::test_should_bump_minor",
    "tests.test_bump::test_should_bump_patch",
]
SCORING: dict[str, Any] = {
    "tree": "/workspace",
    "pristine": "/opt/sandfleet/pristine/workspace",
    "deciding": DECIDING,
    "python": "/opt/venv/bin/python3",  # the task venv, where the set-up installed its test deps
    "timeout_s": 300,
}


@pytest.fixture(scope="module")
def gateway(runsc: Path, base_image: ImageRef, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    build = [
        "task",
        "build",
        "semver-3.1.2",
        "--sdist",
        "semver==3.1.2",
        "--test-deps",
        "pytest-cov",
        "--json",
    ]
    argv = [sys.executable, "-m", "sandfleet.cli", *build]
    done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    assert done.returncode == 0, "task build semver failed (its output is above)"
    built = json.loads(done.stdout.strip().splitlines()[-1])
    url, process, log = start_local_serve(
        tmp_path_factory.mktemp("semver"), warm=1, extra_args=["--image", f"{built['layout']}:{built['tag']}"]
    )
    yield url
    stop_local_serve(process, log)


def test_semvers_own_configured_suite_scores_the_clean_tree_the_bug_and_the_fix(gateway: str) -> None:
    with Fleet(gateway, token=TOKEN, timeout=600) as fleet, fleet.lease("python") as sandbox:
        clean = sandbox.score(task=SCORING)
        assert (clean.outcome, clean.reward) == (Outcome.PASSED, 1.0), (clean.reason, clean["exec"])
        assert "TOTAL" in clean["exec"]["stdout_tail"]  # its --cov report: coverage wrote into the tree
        assert clean.counts["passed"] > 100  # the whole configured suite ran: tests, doctests

        source = sandbox.read_file(MODULE).decode()
        assert source.count(HONEST) == 1
        sandbox.write_file(MODULE, source.replace(HONEST, BUG))
        bug = sandbox.score(task=SCORING)
        assert (bug.outcome, bug.reward) == (Outcome.FAILED, 0.0), bug.reason
        assert {"name": DECIDING[0], "outcome": "failed"} in bug["deciding"]["not_passing"]

        sandbox.write_file(MODULE, source)
        fixed = sandbox.score(task=SCORING)
        assert (fixed.outcome, fixed.reward) == (Outcome.PASSED, 1.0), fixed.reason
        assert fixed["carried"]["changed"] == []  # the fix restored the image's own text
