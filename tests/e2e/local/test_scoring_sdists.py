"""Real projects' own configured test runs under the named-tests rule, each built with `task build --sdist`.

Both suites write into their tree as their projects run them: semver 3.1.2's `.pytest.ini` asks for
`--cov=semver` (coverage writes `.coverage`), doctests and `pythonpath = src tests`; humanize
4.9.0's tox command asks for `--cov` with HTML and XML reports (`htmlcov/`, `coverage.xml`).
Scored by the command form (as the verifier, in the sandbox user's /workspace), semver's honest
tree was an `infra_error` (".coverage: Permission denied"). Scored by their named tests, each suite
runs in a scoring tree the verifier owns: the clean tree and the fixed tree score 1, the bug 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandfleet.client import Fleet, Outcome
from sandfleet.local.artifacts import ImageRef
from tests.e2e.local.conftest import BUILD_TIMEOUT_S
from tests.support.servers import start_local_serve, stop_local_serve

pytestmark = pytest.mark.gvisor

TOKEN = "local-token"


@dataclass(frozen=True)
class Project:
    """An sdist, its test command's arguments, a bug in one file and the tests that decide it."""

    name: str
    sdist: str
    module: str
    honest: str
    bug: str
    deciding: tuple[str, ...]
    pytest_args: tuple[str, ...] = ()  # beyond the project's own configuration
    test_deps: tuple[str, ...] = ()

    def scoring(self) -> dict[str, Any]:
        return {
            "tree": "/workspace",
            "pristine": "/opt/sandfleet/pristine/workspace",
            "deciding": list(self.deciding),
            "pytest_args": list(self.pytest_args),
            "python": "/opt/venv/bin/python3",  # the task venv, where the set-up installed its test deps
            "timeout_s": 300,
        }


PROJECTS = (
    Project(
        name="semver-3.1.2",
        sdist="semver==3.1.2",
        module="/workspace/src/semver/version.py",
        honest="return cls(self._major + 1)",
        bug="return cls(self._major + 2)",
        deciding=(
            "tests.test_bump::test_should_bump_major",
            "tests.test_bump::test_should_bump_minor",
            "tests.test_bump::test_should_bump_patch",
        ),
        test_deps=("pytest-cov",),  # its test extras are a dependency group, which pip does not install
    ),
    Project(
        name="humanize-4.9.0",
        sdist="humanize==4.9.0",
        module="/workspace/src/humanize/number.py",
        honest="(3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 33, 100)",
        bug="(3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 33)",
        deciding=("tests.test_number::test_intword_powers", "tests.test_time::test_time_unit"),
        # tox.ini's test command: its `tests` extra brings pytest-cov and freezegun
        pytest_args=tuple(
            [
                "--cov",
                "humanize",
                "--cov",
                "tests",
                "--cov-report",
                "html",
                "--cov-report",
                "term",
                "--cov-report",
                "xml",
            ]
        ),
    ),
)


@pytest.fixture(scope="module", params=PROJECTS, ids=[p.name for p in PROJECTS])
def served(
    request: pytest.FixtureRequest,
    runsc: Path,
    base_image: ImageRef,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Project, str]]:
    project: Project = request.param
    deps = [arg for dep in project.test_deps for arg in ("--test-deps", dep)]
    build = ["task", "build", project.name, "--sdist", project.sdist, *deps, "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "sandfleet.cli", *build],
        stdout=subprocess.PIPE,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"task build {project.name} failed (its output is above)"
    built = json.loads(done.stdout.strip().splitlines()[-1])
    url, process, log = start_local_serve(
        tmp_path_factory.mktemp(project.name),
        warm=1,
        extra_args=["--image", f"{built['layout']}:{built['tag']}"],
    )
    yield project, url
    stop_local_serve(process, log)


def test_a_projects_own_configured_suite_scores_the_clean_tree_the_bug_and_the_fix(
    served: tuple[Project, str],
) -> None:
    project, url = served
    scoring = project.scoring()
    with Fleet(url, token=TOKEN, timeout=600) as fleet, fleet.lease("python") as sandbox:
        clean = sandbox.score(task=scoring)
        assert (clean.outcome, clean.reward) == (Outcome.PASSED, 1.0), (clean.reason, clean["exec"])
        assert "TOTAL" in clean["exec"]["stdout_tail"]  # its --cov report: coverage wrote into the tree
        assert clean.counts["passed"] > 100  # the whole configured suite ran

        source = sandbox.read_file(project.module).decode()
        assert source.count(project.honest) == 1
        sandbox.write_file(project.module, source.replace(project.honest, project.bug))
        bug = sandbox.score(task=scoring)
        assert (bug.outcome, bug.reward) == (Outcome.FAILED, 0.0), bug.reason
        assert {"name": project.deciding[0], "outcome": "failed"} in bug["deciding"]["not_passing"]

        sandbox.write_file(project.module, source)
        fixed = sandbox.score(task=scoring)
        assert (fixed.outcome, fixed.reward) == (Outcome.PASSED, 1.0), fixed.reason
        assert fixed["carried"]["changed"] == []  # the fix restored the image's own text
