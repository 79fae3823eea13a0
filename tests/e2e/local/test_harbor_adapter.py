"""A real Harbor task through harbor's own verifier, over `sandfleet serve --local` and real gVisor sandboxes.

harbor needs Python 3.12, so its code runs in the Harbor test environment (`.venv-harbor`, made by
hack/harbor-env) as `harbor_trial.py`; this test serves the gateway and reads what harbor reported.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandfleet.local.artifacts import ImageRef
from tests.support.servers import start_local_serve, stop_local_serve

REPO = Path(__file__).resolve().parents[3]
HARBOR_PYTHON = REPO / ".venv-harbor" / "bin" / "python"
DRIVER = Path(__file__).with_name("harbor_trial.py")
TASK = REPO / "tests" / "fixtures" / "harbor" / "fix-mean"

pytestmark = pytest.mark.gvisor


@pytest.fixture
def gateway(runsc: Path, base_image: ImageRef, tmp_path: Path) -> Iterator[str]:
    url, process, log = start_local_serve(tmp_path, warm=2)
    yield url
    stop_local_serve(process, log)


def harbor_trial(gateway: str, out: Path, *, solve: bool) -> dict[str, Any]:
    if not HARBOR_PYTHON.exists():
        pytest.fail(
            f"{HARBOR_PYTHON} is missing: hack/harbor-env makes the Harbor test environment "
            "(make test runs it through hack/build-all)"
        )
    argv = [str(HARBOR_PYTHON), str(DRIVER), str(TASK), str(out), gateway, "local-token", "python"]
    result = subprocess.run(
        [*argv, *(["--solve"] if solve else [])], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return summary


def test_harbor_task_is_verified_by_harbor_in_gvisor(gateway: str, tmp_path: Path) -> None:
    unsolved = harbor_trial(gateway, tmp_path / "unsolved", solve=False)
    solved = harbor_trial(gateway, tmp_path / "solved", solve=True)
    assert unsolved["lease"] != solved["lease"]
    for trial in (unsolved, solved):
        # Harbor uploaded environment/ into the workdir at start, as for any prebuilt-image task.
        assert trial["environment_uploaded"] is True
        # The episode's code can neither forge a reward nor plant tests: both are root's or the verifier's.
        assert trial["episode_cannot_write_logs_or_tests"] is True
        # Harbor's verifier ran /tests/test.sh as the task's verifier user and downloaded its directory.
        assert "verified as verifier" in trial["test_stdout"]
        assert {"reward.json", "test-stdout.txt"} <= set(trial["downloaded"])
    assert solved["solve_exit"] == 0
    assert unsolved["rewards"] == {"reward": 0.0}
    assert solved["rewards"] == {"reward": 1.0}
