"""The product image (operator, gateway, RL actor, learner), built offline, runs in gVisor as uid 10001."""

from __future__ import annotations

import json
import subprocess
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandfleet.rl.catalogue_tasks import load_tasks

pytestmark = pytest.mark.gvisor

REPO = Path(__file__).resolve().parents[3]
PRODUCT_IMAGE_SCRIPT = REPO / "hack" / "product-image"
BUILD_TIMEOUT_S = 1800
UID = 10001
# What every sandfleet Deployment imports first: if these load in the image, the chart's Pods start
# (and the gateway serves E2B's envd: its routes need the e2b SDK, which the image carries).
IMPORTS = (
    "import sandfleet.gateway.app, sandfleet.gateway.routes.e2b_envd, sandfleet.controller.main,"
    " sandfleet.rl, sandfleet.cli"
)
# Every shared object must find its libraries in the image (a manylinux wheel may need a system
# library the minimal rootfs lacks), and every module must be byte-compiled already: the chart runs
# the image with a read-only root filesystem.
CHECK = """
import ctypes, importlib.util, pathlib, sys
root = pathlib.Path("/opt/sandfleet")
shared = [p for p in root.rglob("*.so*") if p.is_file()]
for path in shared:
    ctypes.CDLL(str(path))
sources = [p for p in root.rglob("*.py") if p.is_file()]
missing = [str(p) for p in sources if not pathlib.Path(importlib.util.cache_from_source(str(p))).exists()]
assert not missing, missing[:5]
import numpy, uvloop, yaml, pydantic_core
print(len(shared), len(sources), sys.version_info[:2])
"""


def _build() -> dict[str, Any]:
    result = subprocess.run(
        [str(PRODUCT_IMAGE_SCRIPT), "build", "--json"],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    if result.returncode != 0:
        pytest.fail(f"hack/product-image build failed:\n{result.stderr[-4000:]}")
    data: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return data


@pytest.fixture(scope="module")
def product() -> dict[str, Any]:
    """The product image, built by hack/product-image (a cache hit after the first build)."""
    return _build()


@pytest.fixture(scope="module")
def bundle(product: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The image unpacked by umoci, as a container runtime would see it."""
    bundle = tmp_path_factory.mktemp("product") / "bundle"
    subprocess.run(
        ["umoci", "unpack", "--image", f"{product['layout']}:{product['ref']}", str(bundle)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    yield bundle
    subprocess.run(["rm", "-rf", str(bundle)], check=False)


def _image_config(product: dict[str, Any]) -> dict[str, Any]:
    layout = Path(product["layout"])

    def blob(digest: str) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(
            (layout / "blobs" / "sha256" / digest.split(":")[1]).read_bytes()
        )
        return document

    config: dict[str, Any] = blob(blob(product["digest"])["config"]["digest"])["config"]
    return config


def _runsc(runsc: Path, bundle: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run argv in the image under gVisor, as the image's user with the image's environment."""
    env = json.loads((bundle / "config.json").read_text())["process"]["env"]
    command = [
        str(runsc),
        "--network=none",
        "do",
        "--root",
        str(bundle / "rootfs"),
        "--cwd",
        "/",
        "--",
        "/usr/bin/setpriv",
        f"--reuid={UID}",
        f"--regid={UID}",
        "--clear-groups",
        "/usr/bin/env",
        "-i",
        *env,
        *argv,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


def test_the_build_reports_the_ref_the_archive_and_the_sizes(product: dict[str, Any]) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    ref = f"localhost/sandfleet/sandfleet:{version}"
    assert product["ref"] == product["tag"] == ref
    archive = Path(product["archive"])
    assert archive.name == "image.oci.tar"
    assert archive.parent.name == product["key"]
    assert product["key"].startswith("product-")
    assert archive.stat().st_size == product["archive_bytes"]
    # Small: a minimal Debian, the wheels without their debug info and tests, no compilers.
    assert product["archive_bytes"] < 120e6
    assert product["unpacked_bytes"] < 350e6
    with tarfile.open(archive) as tar:
        member = next(m for m in tar if m.name.lstrip("./") == "index.json")
        handle = tar.extractfile(member)
        assert handle is not None
        index = json.load(handle)
    [manifest] = index["manifests"]
    assert manifest["digest"] == product["digest"]
    assert manifest["annotations"]["org.opencontainers.image.ref.name"] == ref


def test_an_unchanged_tree_is_a_cache_hit_that_rebuilds_nothing(product: dict[str, Any]) -> None:
    archive = Path(product["archive"])
    written = archive.stat().st_mtime_ns
    again = _build()
    # A hit is what makes it fast: the same key, the stored image reused, its archive not rewritten.
    assert again["cached"] is True
    assert (again["key"], again["digest"], again["archive"]) == (
        product["key"],
        product["digest"],
        product["archive"],
    )
    assert archive.stat().st_mtime_ns == written
    assert again["seconds"] < 30  # liveness only


def test_the_image_runs_sandfleet_as_uid_10001_with_its_labels(product: dict[str, Any]) -> None:
    config = _image_config(product)
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["/usr/local/bin/sandfleet"]
    assert config["Cmd"] == ["--help"]
    assert config["WorkingDir"] == "/home/sandfleet"
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == product["version"]
    assert labels["org.opencontainers.image.revision"] == product["revision"]
    assert labels["org.opencontainers.image.source"]
    assert any(entry.startswith("PATH=") and "/usr/local/bin" in entry for entry in config["Env"])


def test_sandfleet_help_and_the_service_imports_run_in_gvisor(runsc: Path, bundle: Path) -> None:
    helped = _runsc(runsc, bundle, ["sandfleet", "--help"])
    assert helped.returncode == 0, helped.stderr
    for command in ("operator", "gateway", "rl"):
        assert command in helped.stdout
    who = _runsc(runsc, bundle, ["/usr/bin/id", "-u"])
    assert who.stdout.strip() == str(UID), who.stderr
    imported = _runsc(runsc, bundle, ["python3", "-c", f"{IMPORTS}; print('imported')"])
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "imported"


def test_the_rl_processes_find_their_default_catalogue_in_the_image(runsc: Path, bundle: Path) -> None:
    # The chart runs `sandfleet rl actor|learner` without --tasks: SANDFLEET_TASKS names the copy.
    script = "from sandfleet.rl.catalogue_tasks import load_tasks; print(len(load_tasks()))"
    loaded = _runsc(runsc, bundle, ["python3", "-c", script])
    assert loaded.returncode == 0, loaded.stderr
    expected = len(load_tasks(REPO / "tasks" / "ci.yaml"))
    assert int(loaded.stdout) == expected


def test_every_extension_loads_and_every_module_is_byte_compiled(runsc: Path, bundle: Path) -> None:
    checked = _runsc(runsc, bundle, ["python3", "-c", CHECK])
    assert checked.returncode == 0, checked.stderr
    shared, sources, version = checked.stdout.split(maxsplit=2)
    assert int(shared) > 10
    assert int(sources) > 1000
    assert version.strip() == "(3, 11)"


def test_the_image_has_no_compilers_package_caches_or_docs(bundle: Path) -> None:
    rootfs = bundle / "rootfs"
    for tool in ("gcc", "cc", "c++", "g++", "ld", "pip", "pip3", "apt-get"):
        assert not (rootfs / "usr" / "bin" / tool).exists(), tool
    assert not list((rootfs / "opt" / "sandfleet").rglob("bin"))
    assert not (rootfs / "root" / ".cache").exists()
    assert not any((rootfs / "var" / "lib" / "apt" / "lists").glob("*_Packages"))
    docs = [p for p in (rootfs / "usr" / "share" / "doc").rglob("*") if p.is_file() and p.name != "copyright"]
    assert docs == []
