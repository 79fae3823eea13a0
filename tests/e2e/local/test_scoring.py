"""Scoring through a real `sandfleet serve --local`: a real pytest run in gVisor, counted as pytest
counts it, typed outcomes, the data plane's errors and the CLI's files, evaluate and exec notes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandfleet.client import Fleet, Outcome, SandboxError
from sandfleet.local.artifacts import ImageRef
from tests.support.pytest_summary import ANSI, MIXED_TESTS, summary_counts
from tests.support.servers import start_local_serve, stop_local_serve

pytestmark = pytest.mark.gvisor

TOKEN = "local-token"
DEPS = "/workspace/.deps"
PYTEST = f"PYTHONPATH={DEPS} python3 -m pytest --color=yes -rA"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project directory: the mixed test module, and pytest's real wheels from PyPI (the sandbox
    is offline), the same version as here so its subtests fixture is there."""
    root = tmp_path_factory.mktemp("project")
    (root / "test_mixed.py").write_text(MIXED_TESTS)
    (root / "test_ok.py").write_text("def test_one():\n    pass\n\n\ndef test_two():\n    pass\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.11",
         "--dest", str(root / "wheels"), f"pytest=={pytest.__version__}"],
        check=True, timeout=300,
    )  # fmt: skip
    return root


@pytest.fixture
def gateway(runsc: Path, base_image: ImageRef, tmp_path: Path) -> Iterator[str]:
    url, process, log = start_local_serve(tmp_path, warm=1, timeout=300)
    yield url
    stop_local_serve(process, log)


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SANDFLEET_URL": url, "SANDFLEET_TOKEN": TOKEN}
    return subprocess.run(
        [sys.executable, "-m", "sandfleet.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_a_real_pytest_run_is_scored_as_pytest_counts_it(gateway: str, project: Path) -> None:
    with Fleet(gateway, token=TOKEN) as fleet, fleet.lease("python") as sandbox:
        lease = sandbox.lease.id
        put = cli(gateway, "files", "put", lease, str(project), ".")
        assert put.returncode == 0, put.stderr
        unpack = (
            "import glob, zipfile\nfor w in glob.glob('wheels/*.whl'): zipfile.ZipFile(w).extractall('.deps')"
        )
        assert sandbox.exec(["python3", "-c", unpack]).ok

        ran = cli(gateway, "evaluate", lease, "--json", "--require-report", "--", PYTEST, "test_mixed.py")
        assert ran.returncode == 1, ran.stderr  # failed
        report = json.loads(ran.stdout)
        output = report["exec"]["stdout_tail"]
        assert "\x1b[" in output
        assert "SKIPPED [3]" in ANSI.sub("", output)
        assert report["outcome"] == "failed"
        assert report["counts"] == summary_counts(output)

        fixed = sandbox.evaluate(shell=f"{PYTEST} test_ok.py", require_report=True)
        assert (fixed.outcome, fixed.reward) == (Outcome.PASSED, 1.0)
        assert fixed.counts == summary_counts(fixed["exec"]["stdout_tail"])
        assert fixed.counts["passed"] == len(fixed.tests)

        slow = sandbox.score(shell="sleep 60", timeout_s=1)
        assert (slow.outcome, slow.reward) == (Outcome.TIMED_OUT, 0.0)
        no_report = sandbox.score(shell="true", require_report=True)
        assert no_report.outcome is Outcome.INFRA_ERROR
        assert not no_report.usable
        shown = cli(gateway, "evaluate", lease, "--require-report", "--", "true")
        assert shown.returncode == 3
        assert shown.stdout.startswith("infra_error")


def test_the_data_plane_as_users_found_it(gateway: str, project: Path, tmp_path: Path) -> None:
    with Fleet(gateway, token=TOKEN) as fleet, fleet.lease("python") as sandbox:
        lease = sandbox.lease.id
        # `tar -C dir -czf - .`, made by the real tar: members `./`, `./test_ok.py`, ...
        made = subprocess.run(["tar", "-C", str(project), "-czf", "-", "."], capture_output=True, check=True)
        unpacked = sandbox.upload_archive("copy", made.stdout)
        assert unpacked["files"] == sum(1 for p in project.rglob("*") if p.is_file())
        assert sandbox.read_file("copy/test_ok.py") == (project / "test_ok.py").read_bytes()

        with pytest.raises(SandboxError) as missing:
            sandbox.read_file("copy/nothing-here")
        assert (missing.value.status, missing.value.code) == (404, "file_not_found")
        raw = httpx.get(
            f"{gateway}/v1/leases/{lease}/files",
            params={"path": "nothing-here"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert raw.json()["error"] == "file_not_found"
        assert raw.json()["source"] == "sandbox"

        got = cli(gateway, "files", "get", lease, "copy/test_ok.py", str(tmp_path / "back.py"))
        assert got.returncode == 0, got.stderr
        assert (tmp_path / "back.py").read_bytes() == (project / "test_ok.py").read_bytes()
        gone = cli(gateway, "files", "get", lease, "copy/nothing-here")
        assert gone.returncode == 1
        assert "file_not_found" in gone.stderr
        assert "{" not in gone.stderr

        cut = cli(gateway, "exec", lease, "--max-output-bytes", "10", "--", "sh", "-c", "yes | head -c 5000")
        assert cut.returncode == 0
        assert len(cut.stdout) == 10
        assert "stdout truncated at 10 bytes (5000 bytes produced)" in cut.stderr
        slow = cli(gateway, "exec", lease, "--timeout", "1", "--", "sleep", "60")
        assert slow.returncode == 124
        assert "timed out" in slow.stderr
        capped = sandbox.exec(["sh", "-c", "printf '\\377\\000abc'"], max_output_bytes=3, encoding="base64")
        assert capped.data() == b"\xff\x00a"
        assert capped.stdout_truncated
