"""The product image build's pure parts: cache keys, the dependency lock, the launcher and pruning."""

from __future__ import annotations

import os
import subprocess
import time
import tomllib
from pathlib import Path

import product_image as pi
import pytest

# isort: split
# product_image puts the sandbox image's builder on sys.path: its module is importable after it.
import image_builder as ib

REPO = Path(__file__).resolve().parents[3]
MIRROR = "http://deb.debian.org/debian"
DEPENDENCIES = ["fastapi>=0.165", "numpy>=2.0"]
# What the image takes from the extras (pi.IMAGE_EXTRAS), as the fixture's pyproject pins it.
EXTRA_PINS = ["e2b==2.63.0"]
EXTRAS = '\n[project.optional-dependencies]\nintegrations = ["gymnasium==1.4.0", "e2b==2.63.0"]\n'


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A small checkout: the files the wheel is built from, a current lock, and unrelated files."""
    root = tmp_path / "repo"
    deps = ", ".join(f'"{d}"' for d in DEPENDENCIES)
    _write(
        root / "pyproject.toml",
        f'[project]\nname = "sandfleet"\nversion = "0.1.0"\ndependencies = [{deps}]\n{EXTRAS}',
    )
    _write(root / "README.md", "# sandfleet\n")
    _write(root / "operator" / "sandfleet" / "__init__.py", '"""sandfleet."""\n')
    _write(root / "operator" / "sandfleet" / "gateway" / "app.py", "APP = 1\n")
    _write(root / "sandbox_image" / "sandfleet_agent" / "__init__.py", '"""agent."""\n')
    _write(root / "docs" / "images.md", "# images\n")
    _write(root / "tests" / "test_x.py", "def test_x() -> None: ...\n")
    _write(root / pi.LOCK_NAME, _lock(DEPENDENCIES + EXTRA_PINS, "fastapi==0.165.0"))
    return root


def _lock(dependencies: list[str], *pins: str) -> str:
    inputs = pi.lock_inputs(dependencies, pi.machine())
    return f"# inputs: {inputs}\n" + "".join(f"{pin} --hash=sha256:{'0' * 64}\n" for pin in pins)


def _git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


def test_an_unchanged_tree_has_the_same_keys(repo: Path) -> None:
    first, second = pi.plan(MIRROR, repo), pi.plan(MIRROR, repo)
    assert first == second
    assert first.key.startswith("product-")
    assert first.deps_key.startswith("product-deps-")
    assert first.ref == "localhost/sandfleet/sandfleet:0.1.0"


def test_bytecode_caches_and_files_outside_the_sources_do_not_change_the_key(repo: Path) -> None:
    before = pi.plan(MIRROR, repo)
    _write(repo / "operator" / "sandfleet" / "__pycache__" / "app.cpython-311.pyc", "junk")
    _write(repo / "docs" / "images.md", "# images, edited\n")
    _write(repo / "tests" / "test_y.py", "")
    _write(repo / "hack" / "notes.txt", "")
    assert pi.plan(MIRROR, repo) == before


@pytest.mark.parametrize(
    "change",
    [
        "operator/sandfleet/gateway/app.py",
        "operator/sandfleet/new_module.py",
        "sandbox_image/sandfleet_agent/__init__.py",
        "README.md",
    ],
)
def test_a_source_change_rebuilds_only_the_top_layer(repo: Path, change: str) -> None:
    before = pi.plan(MIRROR, repo)
    _write(repo / change, "CHANGED = True\n")
    after = pi.plan(MIRROR, repo)
    assert after.key != before.key
    assert after.deps_key == before.deps_key


def test_a_mode_change_under_operator_changes_the_key(repo: Path) -> None:
    before = pi.plan(MIRROR, repo)
    (repo / "operator" / "sandfleet" / "gateway" / "app.py").chmod(0o755)
    assert pi.plan(MIRROR, repo).key != before.key


def test_a_new_pinned_version_rebuilds_the_dependency_layer(repo: Path) -> None:
    before = pi.plan(MIRROR, repo)
    _write(repo / pi.LOCK_NAME, _lock(DEPENDENCIES + EXTRA_PINS, "fastapi==0.165.1"))
    after = pi.plan(MIRROR, repo)
    assert after.deps_key != before.deps_key
    assert after.key != before.key


def test_the_version_changes_the_key_and_the_ref(repo: Path) -> None:
    before = pi.plan(MIRROR, repo)
    pyproject = repo / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"0.1.0"', '"0.2.0"'))
    after = pi.plan(MIRROR, repo)
    assert after.ref == "localhost/sandfleet/sandfleet:0.2.0"
    assert after.key != before.key
    assert after.deps_key == before.deps_key


def test_the_base_rootfs_key_feeds_both_layers() -> None:
    lock = _lock(DEPENDENCIES + EXTRA_PINS, "fastapi==0.165.0")
    one = pi.deps_key(pi.rootfs_key(MIRROR), lock, "x86_64", strip=True)
    other = pi.deps_key(pi.rootfs_key("http://mirror.example/debian"), lock, "x86_64", strip=True)
    assert one != other
    assert pi.deps_key(pi.rootfs_key(MIRROR), lock, "x86_64", strip=False) != one
    assert pi.deps_key(pi.rootfs_key(MIRROR), lock, "aarch64", strip=True) != one
    assert pi.product_key(one, "s", "0.1.0", "r", "u") != pi.product_key(other, "s", "0.1.0", "r", "u")


@pytest.mark.parametrize("field", range(5))
def test_every_product_input_is_in_the_key(field: int) -> None:
    inputs = ["product-deps-1", "sources", "0.1.0", "abc", "https://example.invalid/sandfleet"]
    changed = list(inputs)
    changed[field] += "x"
    assert pi.product_key(*inputs) == pi.product_key(*inputs)
    assert pi.product_key(*changed) != pi.product_key(*inputs)


def test_the_revision_is_the_last_commit_of_the_sources_and_dirty_only_for_them(repo: Path) -> None:
    assert pi.revision(repo) == "unknown"
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "first")
    commit = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert pi.revision(repo) == commit
    _write(repo / "docs" / "images.md", "edited\n")
    _git(repo, "commit", "-qam", "docs only")
    assert pi.revision(repo) == commit
    _write(repo / "operator" / "sandfleet" / "gateway" / "app.py", "APP = 2\n")
    assert pi.revision(repo) == f"{commit}-dirty"


def test_a_stale_lock_is_resolved_again_and_a_current_one_is_not(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, ...]] = []

    def resolve(dependencies: tuple[str, ...], arch: str) -> str:
        calls.append(dependencies)
        return _lock(list(dependencies), "fastapi==0.170.0", "numpy==2.5.0")

    monkeypatch.setattr(pi, "resolve_lock", resolve)
    pi.plan(MIRROR, repo)
    assert calls == []
    pyproject = repo / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"numpy>=2.0"', '"numpy>=2.1"'))
    stale = pi.plan(MIRROR, repo)
    assert calls == [("fastapi>=0.165", "numpy>=2.1", "e2b==2.63.0")]
    assert "numpy==2.5.0" in (repo / pi.LOCK_NAME).read_text()
    assert pi.plan(MIRROR, repo) == stale
    assert len(calls) == 1


def test_the_runtime_dependencies_and_only_the_named_extra_pins_are_read(repo: Path) -> None:
    pyproject = repo / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + 'dev = ["pytest>=9"]\n')
    assert pi.read_project(repo).dependencies == (*DEPENDENCIES, *EXTRA_PINS)


@pytest.mark.parametrize(
    "extras",
    ["", '\n[project.optional-dependencies]\nintegrations = ["gymnasium==1.4.0"]\n',
     '\n[project.optional-dependencies]\nintegrations = ["e2b==2.63.0", "E2B>=2"]\n'],
)  # fmt: skip
def test_an_image_pin_missing_from_its_extra_or_given_twice_fails_saying_which(
    repo: Path, extras: str
) -> None:
    pyproject = repo / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(EXTRAS, extras))
    with pytest.raises(ib.BuildError, match="'integrations' extra must list 'e2b' once"):
        pi.read_project(repo)


@pytest.mark.parametrize(
    ("requirement", "name"),
    [("e2b==2.63.0", "e2b"), ("E2B_Dockerfile.Utils[x] >= 1", "e2b-dockerfile-utils"),
     ("uvicorn[standard]>=0.54", "uvicorn"), ("e2b; python_version >= '3.11'", "e2b"),
     ("e2b @ https://example.invalid/e2b.whl", "e2b"), ("e2bx==1", "e2bx")],
)  # fmt: skip
def test_requirement_names_are_normalized(requirement: str, name: str) -> None:
    assert pi.requirement_name(requirement) == name


def test_the_lock_is_pinned_hashed_sorted_and_records_its_inputs() -> None:
    report: dict[str, object] = {
        "install": [
            {
                "metadata": {"name": name, "version": version},
                "download_info": {"archive_info": {"hashes": {"sha256": digest}}},
            }
            for name, version, digest in [("PyYAML", "6.0.4", "ab" * 32), ("fastapi", "0.165.0", "cd" * 32)]
        ]
    }
    text = pi.format_lock(report, "1234", "x86_64")
    pins = [line for line in text.splitlines() if not line.startswith("#")]
    assert pins == [f"fastapi==0.165.0 --hash=sha256:{'cd' * 32}", f"pyyaml==6.0.4 --hash=sha256:{'ab' * 32}"]
    assert pi.lock_inputs_of(text) == "1234"
    assert pi.lock_inputs_of("fastapi==1\n") is None


def test_the_committed_lock_is_current_for_pyproject() -> None:
    text = (REPO / pi.LOCK_NAME).read_text()
    project = pi.read_project(REPO)
    # The lock is committed for x86_64 (the build machines); a change to the dependencies needs
    # `hack/product-image lock` (a build does it too) and the new lock committed.
    assert pi.lock_inputs_of(text) == pi.lock_inputs(project.dependencies, "x86_64"), (
        "hack/product-image.lock is stale: run hack/product-image lock"
    )
    pins = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert pins
    assert all("==" in line and " --hash=sha256:" in line for line in pins)
    names = {line.split("==")[0] for line in pins}
    for requirement in project.dependencies:
        name = requirement.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip()
        assert name.lower().replace("_", "-") in {n.replace("_", "-") for n in names}


def test_platform_tags_cover_bookworm_glibc_and_no_newer() -> None:
    tags = pi.platform_tags("x86_64")
    assert "manylinux_2_36_x86_64" in tags
    assert "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_37_x86_64" not in tags
    arm = pi.platform_tags("aarch64")
    assert "manylinux2014_aarch64" in arm
    assert "manylinux1_aarch64" not in arm
    options = pi.pip_target_options("x86_64")
    assert "--only-binary=:all:" in options
    assert "--abi=cp311" in options


def test_the_launcher_runs_the_console_script_pyproject_declares() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attribute = scripts["sandfleet"].partition(":")
    launcher = pi.launcher_script()
    assert launcher.startswith("#!/usr/bin/python3\n")
    assert f"from {module} import {attribute}" in launcher
    compile(launcher, pi.LAUNCHER, "exec")


def test_tree_bytes_counts_a_hard_linked_file_once(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 100)
    os.link(tmp_path / "a", tmp_path / "b")
    (tmp_path / "c").symlink_to("a")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "e").write_bytes(b"y" * 10)
    assert pi.tree_bytes(tmp_path) == 110


def test_prune_keeps_the_current_and_newest_images_and_never_touches_sandbox_images(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDFLEET_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "cache" / "images"
    current = pi.plan(MIRROR, repo)
    names = ["product-old1", "product-old2", "product-old3", current.key]
    for age, name in enumerate(names):
        (root / name).mkdir(parents=True)
        stamp = time.time() - 1000 + age
        os.utime(root / name, (stamp, stamp))
    for name in [current.deps_key, "product-deps-old", ".product-crashed.x", "base-1", "task-1", ".base-2"]:
        (root / name).mkdir(parents=True)
    rootfs = f"debian-bookworm-product-{pi.rootfs_key(MIRROR)}.tar"
    for name in [rootfs, "debian-bookworm-product-old.tar", "debian-bookworm-abc.tar"]:
        (root / name).write_bytes(b"")
    removed = pi.prune(current, MIRROR, keep=3)
    assert removed == sorted(
        [".product-crashed.x", "debian-bookworm-product-old.tar", "product-deps-old", "product-old1"]
    )
    left = sorted(p.name for p in root.iterdir())
    assert left == sorted(
        [
            ".base-2",
            "base-1",
            "debian-bookworm-abc.tar",
            rootfs,
            "product-old2",
            "product-old3",
            current.key,
            current.deps_key,
            "task-1",
        ]
    )
    assert pi.prune(current, MIRROR, keep=1) == ["product-old2", "product-old3"]


def test_planning_this_checkout_resolves_nothing_builds_nothing_and_hashes_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What keeps a warm plan fast: the committed lock is current (nothing resolved or rewritten),
    # nothing is built or snapshotted, and the sources are hashed once, in place.
    def offline(dependencies: tuple[str, ...], arch: str) -> str:
        raise AssertionError("the committed lock is stale: run hack/product-image lock")

    def forbidden(name: str) -> object:
        def called(*args: object, **kwargs: object) -> None:
            raise AssertionError(f"planning called {name}")

        return called

    monkeypatch.setattr(pi, "resolve_lock", offline)
    for name in ("write_atomically", "product_rootfs", "build_deps", "snapshot_sources", "build_wheel"):
        monkeypatch.setattr(pi, name, forbidden(name))
    monkeypatch.setattr(ib, "run", forbidden("image_builder.run"))
    hashed: list[tuple[Path, str]] = []
    digest = pi.source_digest

    def counted(repo: Path = pi.REPO) -> str:
        hashed.append((repo, digest(repo)))
        return hashed[-1][1]

    monkeypatch.setattr(pi, "source_digest", counted)
    started = time.monotonic()
    the_plan = pi.plan(MIRROR)
    assert time.monotonic() - started < 30  # liveness only: the mechanism is what is checked
    assert hashed == [(REPO, the_plan.sources)]


def test_the_snapshot_a_build_uses_has_the_digest_the_cache_check_used(repo: Path, tmp_path: Path) -> None:
    _write(repo / "operator" / "sandfleet" / "__pycache__" / "app.cpython-311.pyc", "junk")
    snapshot = tmp_path / "snapshot"
    pi.snapshot_sources(repo, snapshot)
    assert pi.source_digest(snapshot) == pi.plan(MIRROR, repo).sources
    assert not (snapshot / "docs").exists()
    assert not list(snapshot.rglob("__pycache__"))
