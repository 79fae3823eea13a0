"""The task factory on a real PyPI package, and the shipped CI catalogue proven by `task check` in gVisor."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandfleet.local.artifacts import ImageRef
from sandfleet.rl.catalogue_tasks import build_image, from_catalogue
from sandfleet.tasks.catalogue import dump_catalogue, parse_catalogue
from tests.support.servers import start_local_serve, stop_local_serve

REPO = Path(__file__).resolve().parents[3]
CI_CATALOGUE = REPO / "tasks" / "ci.yaml"
# A liveness limit only: how fast a check of the CI subset is depends on the machine, and belongs in
# a benchmark; the test prints its time.
CHECK_LIVENESS_S = 600.0


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandfleet.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_mining_a_real_sdist_keeps_only_mutants_its_tests_catch(tmp_path: Path) -> None:
    # On the host (the mutants are ours): xmltodict's own suite, a handful of seeded mutants.
    catalogue, summary = tmp_path / "mined.yaml", tmp_path / "summary.json"
    done = _cli("task", "mine", "--sdist", "xmltodict==0.13.0", "--catalogue", str(catalogue),
                "--max-mutants", "6", "--seed", "3", "--summary-json", str(summary))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "mutant 6/6" in done.stderr  # progress is shown per mutant
    result = json.loads(summary.read_text())
    assert result["tried"] == 6
    assert result["kept"] + sum(n for r, n in result["reasons"].items() if r != "kept") == 6
    mined = parse_catalogue(catalogue.read_text(), str(catalogue))
    assert len(mined.tasks) == result["kept"]
    passing = set(mined.sources["xmltodict-0.13.0"].tests_passing)
    for task in mined.tasks:
        assert task.fail_to_pass
        assert set(task.fail_to_pass) <= passing
        assert task.pass_to_pass() == sorted(passing - set(task.fail_to_pass))


@pytest.fixture(scope="module")
def catalogue_gateway(
    runsc: Path, base_image: ImageRef, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[str]]:
    """`serve --local --image` with the CI catalogue's image (its sdists from PyPI, then cached)."""
    built = build_image(from_catalogue(CI_CATALOGUE), "tasks-ci")
    url, process, log = start_local_serve(
        tmp_path_factory.mktemp("catalogue"),
        extra_args=["--image", f"{built['layout']}:{built['tag']}"],
        timeout=600,
    )
    yield ["--url", url, "--token", "local-token", "--pool", "python"]
    stop_local_serve(process, log)  # and none of its sandboxes left


@pytest.mark.gvisor
def test_the_ci_catalogue_is_verified_in_gvisor(catalogue_gateway: list[str], tmp_path: Path) -> None:
    summary = tmp_path / "check.json"
    started = time.monotonic()
    done = _cli(
        "task", "check", str(CI_CATALOGUE), *catalogue_gateway, "--summary-json", str(summary),
        timeout=CHECK_LIVENESS_S,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    print(f"task check of the CI subset ({CI_CATALOGUE.name}): {elapsed:.1f} s")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    verdicts = json.loads(summary.read_text())
    expected = parse_catalogue(CI_CATALOGUE.read_text(), str(CI_CATALOGUE))
    assert [v["task"] for v in verdicts] == [t.id for t in expected.tasks]
    for verdict, task in zip(verdicts, expected.tasks, strict=True):
        assert verdict["verified"], verdict
        assert verdict["bug_failing"] == len(task.fail_to_pass)
        assert verdict["fixed_passing"] == len(task.fail_to_pass) + len(task.pass_to_pass())


@pytest.mark.gvisor
def test_check_fails_a_task_whose_bug_its_tests_do_not_catch(
    catalogue_gateway: list[str], tmp_path: Path
) -> None:
    # The same tree, but the task claims a test that passes with the bug: check must refuse it.
    catalogue = parse_catalogue(CI_CATALOGUE.read_text(), str(CI_CATALOGUE))
    task = catalogue.tasks[0]
    survivor = next(t for t in task.pass_to_pass())
    lying = catalogue.model_copy(update={"tasks": [task.model_copy(update={"fail_to_pass": [survivor]})]})
    path = tmp_path / "lying.yaml"
    path.write_text(dump_catalogue(lying))
    done = _cli("task", "check", str(path), *catalogue_gateway)
    assert done.returncode == 1
    assert "FAILED" in done.stderr
    assert "FAIL_TO_PASS tests pass" in done.stderr
