"""`task build` for real: a PyPI sdist, the README's directory, a host full of pip settings, offline wheels.

Each build is a real one (mmdebstrap'd base, umoci layers, pip in a chroot of the image), cached by
key, so a rerun only checks; each image is then run in gVisor to prove what the build promised.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandfleet.local.artifacts import IMAGE_BUILD_SCRIPT, ImageRef
from sandfleet.local.runtime import LocalRuntime
from tests.e2e.local.conftest import BUILD_TIMEOUT_S

pytestmark = pytest.mark.gvisor

REPO = Path(__file__).resolve().parents[3]
# A small real package whose sdist ships its own tests (test_six.py); not one of sandfleet.rl's.
SDIST = "six==1.16.0"
# What leaked from the host into set-ups before and made pip fail with "Permission denied".
HOST_LEAKS = {
    "PIP_TARGET": "/root/pip-target-leaked",
    "PIP_PREFIX": "/root/pip-prefix-leaked",
    "PIP_FIND_LINKS": "/root/wheels-leaked",
    "PYENV_ROOT": "/root/pyenv-leaked",
    "PYENV_VERSION": "3.11.7-leaked",
    "PYTHONPATH": "/root/pythonpath-leaked",
}


def _build(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a build (its progress goes to the test's stderr as it streams) and read its JSON line."""
    done = subprocess.run(
        argv, stdout=subprocess.PIPE, stderr=None, text=True, timeout=BUILD_TIMEOUT_S, env=env, check=False
    )
    assert done.returncode == 0, f"{argv} failed (its output is above)"
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["log_text"] = Path(result["log"]).read_text()
    return result


def _ref(result: dict[str, Any]) -> ImageRef:
    layout = Path(result["layout"])
    index = json.loads((layout / "index.json").read_text())
    digests = [
        m["digest"]
        for m in index["manifests"]
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == result["tag"]
    ]
    assert digests == [result["digest"]], "the recorded digest is the layout's manifest digest"
    return ImageRef(layout=layout, tag=str(result["tag"]), digest=str(result["digest"]))


async def _run_in(runsc: Path, image: ImageRef, commands: list[str]) -> list[dict[str, Any]]:
    """Run shell commands as the sandbox user in one fresh gVisor sandbox of the image."""
    results = []
    async with LocalRuntime(image, runsc) as runtime:
        sandbox = await runtime.create()
        async with httpx.AsyncClient(
            base_url=sandbox.url, headers=sandbox.headers, timeout=120, trust_env=False
        ) as agent:
            for command in commands:
                response = await agent.post("/v1/exec", json={"shell": command, "timeout_s": 100})
                assert response.status_code == 200, response.text
                results.append(response.json())
    return results


async def test_a_pypi_sdist_becomes_a_task_whose_own_tests_run_in_gvisor(runsc: Path) -> None:
    result = _build(
        [sys.executable, "-m", "sandfleet.cli", "task", "build", "six", "--sdist", SDIST, "--json"]
    )
    assert result["source"]["kind"] == "sdist"
    assert result["source"]["location"] == SDIST
    assert len(result["source"]["sha256"]) == 64
    assert "six-1.16.0" in result["log_text"]
    pip, imported, tests, tamper, history = await _run_in(
        runsc,
        _ref(result),
        [
            "python3 -m pip --version",
            "python3 -c 'import six; print(six.__file__, six.__version__)'",
            "python3 -m pytest -q -p no:cacheprovider test_six.py",
            "touch /opt/venv/lib/python3.11/site-packages/planted.pth",
            "git log --format=%s",
        ],
    )
    assert pip["exit_code"] == 0, pip
    assert "/opt/venv/" in pip["stdout"]
    assert imported["stdout"].split() == ["/workspace/six.py", "1.16.0"]
    assert tests["exit_code"] == 0, tests["stdout"][-2000:]
    assert " passed" in tests["stdout"]
    # The venv the verifier's tests run with is root's: the episode cannot plant code in it.
    assert tamper["exit_code"] != 0
    assert "Permission denied" in tamper["stderr"]
    assert len(history["stdout"].splitlines()) == 1


@pytest.fixture
def calc_task(tmp_path: Path) -> dict[str, Any]:
    """A local package built as README.md writes it, by a builder whose environment is full of pip
    settings."""
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "calc"\nversion = "0.1"\n[tool.setuptools]\npy-modules = ["calc"]\n'
    )
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "tests" / "test.sh").write_text("python3 -c 'import calc; assert calc.add(2, 3) == 5'\n")
    env = {**os.environ, **HOST_LEAKS, "PATH": f"/root/path-leaked:{os.environ['PATH']}"}
    argv = [str(IMAGE_BUILD_SCRIPT), "--json", "task", "--name", "calc", "--workspace", str(repo)]
    # README.md's `--setup 'pip install -e .'`, then the environment it ran with, for the log.
    return _build([*argv, "--setup", "pip install -e . && env | sort"], env=env)


async def test_the_readme_example_builds_hermetically_on_a_host_full_of_pip_settings(
    runsc: Path, calc_task: dict[str, Any]
) -> None:
    result = calc_task
    log = result["log_text"]
    assert "Successfully installed calc-0.1" in log
    for name, value in {**HOST_LEAKS, "PATH": "/root/path-leaked"}.items():
        assert value not in log, f"{name} leaked into the set-up"
    assert not any(line.split("] ", 1)[-1].startswith("PYENV") for line in log.splitlines())
    imported, as_verifier = await _run_in(
        runsc,
        _ref(result),
        [
            "cd /tmp && python3 -c 'import calc; print(calc.__file__)'",
            "python3 -m pip show calc | grep -i '^editable project location'",
        ],
    )
    assert imported["stdout"].strip() == "/workspace/calc.py", imported
    assert as_verifier["stdout"].strip().endswith("/workspace")


@pytest.fixture
def offline_task(tmp_path: Path) -> dict[str, Any]:
    """The sdist built from a wheels directory only: the sdist, pytest, and the sdist's build backend."""
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(wheels)]
    subprocess.run([*pip, "--no-deps", "--no-binary", ":all:", SDIST], check=True, timeout=600)
    # Pure-Python wheels, so they fit the image's python3.11 whatever the host runs.
    pure = [
        "--only-binary",
        ":all:",
        "--python-version",
        "3.11",
        "--implementation",
        "py",
        "--platform",
        "any",
    ]
    subprocess.run([*pip, *pure, "pytest", "setuptools", "wheel"], check=True, timeout=600)
    argv = [str(IMAGE_BUILD_SCRIPT), "--json", "task", "--name", "six-offline", "--sdist", SDIST]
    return _build([*argv, "--wheels", str(wheels)])


async def test_offline_wheels_build_with_no_network_and_the_tests_run(
    runsc: Path, offline_task: dict[str, Any]
) -> None:
    result = offline_task
    log = result["log_text"]
    assert "unshare --net" in log.splitlines()[0], "the offline set-up runs without a network"
    assert "/tmp/sandfleet-wheels" in log
    (tests,) = await _run_in(runsc, _ref(result), ["python3 -m pytest -q -p no:cacheprovider test_six.py"])
    assert tests["exit_code"] == 0, tests["stdout"][-2000:]
    assert " passed" in tests["stdout"]
