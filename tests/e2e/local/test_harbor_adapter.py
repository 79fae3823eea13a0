"""Real Harbor tasks through harbor's own code, over `sandfleet serve --local` and real gVisor sandboxes.

harbor needs Python 3.12, so its code runs in the Harbor test environment (`.venv-harbor`, made by
hack/harbor-env): `harbor_trial.py` drives the verifier on a user-split pool, and `harbor run` itself
runs a Terminal-Bench-shaped task whose image `sandfleet harbor build` made from its Dockerfile, on a
pool whose commands run as root. These tests serve the gateway and read what harbor reported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandfleet.local.artifacts import ImageRef
from tests.support.registry import start_registry
from tests.support.servers import start_local_serve, stop_local_serve

REPO = Path(__file__).resolve().parents[3]
HARBOR_PYTHON = REPO / ".venv-harbor" / "bin" / "python"
HARBOR = REPO / ".venv-harbor" / "bin" / "harbor"
DRIVER = Path(__file__).with_name("harbor_trial.py")
TASK = REPO / "tests" / "fixtures" / "harbor" / "fix-mean"
# Terminal-Bench's shape: environment/Dockerfile (FROM debian:bookworm-slim, WORKDIR /app), tests/test.sh,
# solution/solve.sh, and a separate verifier that gets the episode's /app/hello.txt as an artifact.
BUILT_TASK = REPO / "tests" / "fixtures" / "harbor" / "hello-app"
IMPORT_PATH = "sandfleet.adapters.harbor:SandfleetEnvironment"
# The task `harbor tasks init` starts from, as harbor ships it (FROM ubuntu:24.04, WORKDIR /app).
HARBOR_TEMPLATES = REPO / ".venv-harbor" / "lib"
TEMPLATE_GLOB = "python3*/site-packages/harbor/cli/template-task"

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


def test_harbor_run_with_the_oracle_passes_on_the_default_pool_in_harbors_shared_mode(
    gateway: str, tmp_path: Path
) -> None:
    # Users split: the oracle writes its log to /logs/agent (the agent makes it the sandbox user's)
    # and Harbor's verifier runs /tests/test.sh as the verifier, through evaluate, in the same lease.
    result = harbor_run(TASK, gateway, None, tmp_path / "jobs")
    assert result["exception_info"] is None, result["exception_info"]
    assert result["oracle_log"] == ""
    assert result["verifier_result"]["rewards"] == {"reward": 1.0}
    idle = harbor_run(TASK, gateway, None, tmp_path / "idle", agent="nop")
    assert (idle["exception_info"], idle["verifier_result"]["rewards"]) == (None, {"reward": 0.0})


def base_archive(base_image: ImageRef) -> Path:
    archive = base_image.layout.parent / "image.oci.tar"
    if shutil.which("buildah") is None or not archive.exists():
        pytest.fail(f"buildah (hack/apt-packages.txt) and {archive} (sandbox_image/build) are needed")
    return archive


def harbor_build(task: Path, out: Path, base: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """`sandfleet harbor build TASK --offline --base BASE`: every FROM that names a registry becomes BASE."""
    argv = [sys.executable, "-m", "sandfleet.cli", "harbor", "build", str(task), "--out", str(out),
            "--base", base, "--offline", *extra]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def built_image(runsc: Path, base_image: ImageRef, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The hello-app task's image: its Dockerfile built by buildah on sandfleet's base in a local registry."""
    directory = tmp_path_factory.mktemp("harbor-build")
    registry = start_registry(directory / "registry")
    try:
        registry.push(f"oci-archive:{base_archive(base_image)}", "sandfleet/base:1")
        built = harbor_build(BUILT_TASK, directory / "hello-app.oci.tar", f"{registry.host}/sandfleet/base:1",
                             "--registry-cert-dir", str(registry.cert_dir),
                             "--registry-auth-file", str(registry.auth_file))  # fmt: skip
    finally:
        registry.stop()
    assert built.returncode == 0, built.stderr[-4000:]
    # --offline: the FROM was rewritten whether or not Docker Hub answers here, and the note says so.
    assert (
        f"FROM debian:bookworm-slim rewritten to FROM {registry.host}/sandfleet/base:1 (--offline)"
        in built.stderr
    )
    image: str = json.loads(built.stdout.strip().splitlines()[-1])["image"]
    return image


@pytest.fixture(scope="module")
def root_gateway(built_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url, process, log = start_local_serve(
        tmp_path_factory.mktemp("harbor-root"),
        warm=1,
        extra_args=["--commands-as-image-user", "--image", built_image],
        timeout=600,
    )
    yield url
    stop_local_serve(process, log)


def harbor_run(
    task: Path, gateway: str, image: str | None, jobs: Path, agent: str = "oracle"
) -> dict[str, Any]:
    """`harbor run -a AGENT` on one task over the gateway (the pool's own image without one)."""
    argv = [str(HARBOR), "run", "-p", str(task), "-a", agent, "-e", IMPORT_PATH, "-o", str(jobs),
            "-n", "1", "-y", "-q", "--ek", f"url={gateway}", "--ek", "token=local-token",
            "--ek", "pool=python", *(["--ek", f"image={image}"] if image else [])]  # fmt: skip
    # litellm (imported by harbor) would try to fetch its model cost map from the internet first.
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (trial,) = [path for path in jobs.glob("*/*/result.json")]
    result: dict[str, Any] = json.loads(trial.read_text())
    oracle_log = trial.parent / "agent" / "oracle.txt"
    result["oracle_log"] = oracle_log.read_text() if oracle_log.exists() else None
    return result


def test_harbor_run_with_the_oracle_passes_on_a_root_pool_of_the_built_image(
    root_gateway: str, built_image: str, tmp_path: Path
) -> None:
    result = harbor_run(BUILT_TASK, root_gateway, built_image, tmp_path / "jobs")
    assert result["exception_info"] is None, result["exception_info"]
    # The oracle ran solve.sh as root in the episode's sandbox and its log came back from /logs/agent;
    # the verifier ran in a fresh sandbox of the same image (Harbor's separate mode), with the artifact.
    assert result["verifier_environment_mode"] == "separate"
    assert result["oracle_log"] == ""
    assert result["verifier_result"]["rewards"] == {"reward": 1.0}
    # An agent that does nothing gets 0 from the same verifier: the reward is the task's, not a given.
    idle = harbor_run(BUILT_TASK, root_gateway, built_image, tmp_path / "idle", agent="nop")
    assert (idle["exception_info"], idle["verifier_result"]["rewards"]) == (None, {"reward": 0.0})


def test_a_root_episodes_own_sandbox_refuses_harbors_shared_verifier(
    root_gateway: str, built_image: str, tmp_path: Path
) -> None:
    shared = tmp_path / "hello-app"
    shutil.copytree(BUILT_TASK, shared)
    toml = shared / "task.toml"
    toml.write_text(toml.read_text().replace('environment_mode = "separate"', 'environment_mode = "shared"'))
    result = harbor_run(shared, root_gateway, built_image, tmp_path / "jobs")
    # Root could rewrite the tests or forge the reward there: no reward, and the error says what to set.
    assert result["verifier_result"] is None
    assert result["exception_info"]["exception_type"] == "AddTestsDirError"
    assert 'set [verifier] environment_mode = "separate"' in result["exception_info"]["exception_traceback"]


def test_harbors_template_task_with_a_step_that_needs_the_network_fails_naming_it(
    base_image: ImageRef, tmp_path: Path
) -> None:
    # harbor's own template Dockerfile (not this project's), plus the line many tasks start with.
    template = next(HARBOR_TEMPLATES.glob(TEMPLATE_GLOB), None)
    assert template is not None, f"no {TEMPLATE_GLOB} under {HARBOR_TEMPLATES}: run hack/harbor-env"
    task = tmp_path / "template-task"
    shutil.copytree(template, task)
    dockerfile = task / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "\nRUN apt-get update && apt-get install -y cowsay\n")
    built = harbor_build(task, tmp_path / "template.oci.tar", f"oci-archive:{base_archive(base_image)}")
    assert built.returncode == 1, built.stderr[-4000:]
    assert "harbor build: FROM ubuntu:24.04 rewritten to FROM oci-archive:" in built.stderr
    assert "harbor build: step 3/3 failed: RUN apt-get update && apt-get install -y cowsay" in built.stderr
    assert "it needed the network" in built.stderr
    assert not (tmp_path / "template.oci.tar").exists()
