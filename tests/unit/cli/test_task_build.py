"""`task build`'s pure parts: pins, names, test extras, the set-up script, its clean environment, sources."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from sandfleet.cli import app
from sandfleet.cli.task_commands import task_builder_on_path

task_builder_on_path()

import build_cli  # noqa: E402
import bundle_image  # noqa: E402
import image_builder as ib  # noqa: E402
import task_image as ti  # noqa: E402

NAMES = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,20}[A-Za-z0-9])?", fullmatch=True)
VERSIONS = st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){0,3}((a|b|rc|\.post|\.dev)[0-9]{1,2})?", fullmatch=True)
# What leaked from the host into set-ups before, and broke pip there ("Permission denied").
HOST_LEAKS = {
    "PIP_TARGET": "/root/pip-target",
    "PIP_FIND_LINKS": "/opt/wheels",
    "PIP_CACHE_DIR": "/root/.cache/pip",
    "PIP_CERT": "/root/cert.pem",
    "PYENV_ROOT": "/root/.pyenv",
    "PYENV_VERSION": "3.11.7",
    "PYTHONPATH": "/root/site",
    "VIRTUAL_ENV": "/root/venv",
}


@given(NAMES, VERSIONS)
def test_an_exact_pin_splits_into_name_and_version(name: str, version: str) -> None:
    assert ti.parse_pin(f"{name}=={version}") == (name, version)
    assert ti.TaskSource.sdist(f" {name} == {version} ").location == f"{name}=={version}"


@pytest.mark.parametrize(
    "loose", ["six", "six>=1.16", "six==", "==1.0", "six==1.*", "six==1.0; python_version>'3'", "six~=1.0"]
)
def test_anything_looser_than_an_exact_pin_is_refused(loose: str) -> None:
    with pytest.raises(ib.BuildError, match="NAME==VERSION"):
        ti.parse_pin(loose)


@pytest.mark.parametrize("name", ["", "-x", "a/b", "a b", "../x", "x" * 64, "é"])
def test_task_names_must_fit_an_image_tag(name: str) -> None:
    with pytest.raises(ib.BuildError, match="task name"):
        ti.check_name(name)


@given(NAMES.filter(lambda name: len(name) <= 63))
def test_tag_safe_names_are_accepted(name: str) -> None:
    assert ti.check_name(name) == name


def test_test_extras_come_from_any_metadata_the_tree_ships(tmp_path: Path) -> None:
    (tmp_path / "PKG-INFO").write_text(
        "Metadata-Version: 2.1\nName: p\nProvides-Extra: Testing\nProvides-Extra: docs\n"
    )
    assert ti.test_extras(tmp_path) == ["testing"]
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "p"\n[project.optional-dependencies]\nTest = ["x"]\n'
    )
    assert ti.test_extras(tmp_path) == ["test", "testing"]
    (tmp_path / "setup.cfg").write_text("[options.extras_require]\ntests =\n    hypothesis\n")
    assert ti.test_extras(tmp_path) == ["test", "tests", "testing"]


def test_test_extras_from_egg_info_and_none_at_all(tmp_path: Path) -> None:
    assert ti.test_extras(tmp_path) == []
    (tmp_path / "pyproject.toml").write_text("not toml [")
    assert ti.test_extras(tmp_path) == []
    (tmp_path / "p.egg-info").mkdir()
    (tmp_path / "p.egg-info" / "requires.txt").write_text(
        "attrs\n\n[tests:python_version < '3.12']\nmock\n[dev]\nx\n"
    )
    assert ti.test_extras(tmp_path) == ["tests"]
    assert ti.declared_extras(tmp_path) == {"tests", "dev"}


def test_an_sdist_installs_itself_with_its_test_extras_and_pytest() -> None:
    command = ti.install_command(True, ["test", "testing"], ["hypothesis==6.1", "PyTest"])
    assert command == "python3 -m pip install -e '.[test,testing]' pytest hypothesis==6.1"
    assert ti.install_command(True, [], []) == "python3 -m pip install -e . pytest"


def test_test_deps_alone_bring_pytest_and_nothing_means_no_install() -> None:
    assert ti.install_command(False, ["test"], ["mock"]) == "python3 -m pip install pytest mock"
    assert ti.install_command(False, ["test"], []) is None


def test_the_set_up_script_installs_then_runs_the_users_command_and_stops_at_a_failure() -> None:
    assert ti.setup_script(None, None) is None
    script = ti.setup_script("python3 -m pip install pytest", "pip install -e .", record=True)
    assert script is not None
    assert script.splitlines() == [
        "set -e",
        "cd /workspace",
        "python3 -m pip install pytest",
        "pip install -e .",
        "python3 -m pip list --format=freeze",
    ]
    assert ti.setup_script(None, "make") == "set -e\ncd /workspace\nmake"


def test_the_set_up_environment_is_the_images_whatever_the_host_has(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in HOST_LEAKS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PATH", "/root/.pyenv/shims:/usr/bin")
    for offline in (False, True):
        env = ti.setup_environment(offline=offline, ca_bundle=not offline)
        assert env["PATH"] == ib.IMAGE_PATH
        assert env["PATH"].startswith(f"{ib.TASK_VENV}/bin:")
        assert env["HOME"] == f"/home/{ib.SANDBOX_USER}"
        assert env["VIRTUAL_ENV"] == ib.TASK_VENV
        assert not set(HOST_LEAKS.values()) & set(env.values())
        assert ("PIP_NO_INDEX" in env) == offline
        assert env.get("PIP_FIND_LINKS") == (ti.WHEELS_IN_IMAGE if offline else None)
        assert env.get("PIP_CERT") == (None if offline else ti.CA_IN_IMAGE)


def test_host_tools_get_no_pip_or_pyenv_settings_of_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in HOST_LEAKS.items():
        monkeypatch.setenv(name, value)
    env = ti.host_environment()
    assert not any(name.startswith("PYENV") for name in env)
    assert not set(HOST_LEAKS.values()) & set(env.values())
    assert env["PIP_CONFIG_FILE"] == "/dev/null"


def test_the_cache_key_changes_with_every_input() -> None:
    inputs = ("base-1", "six", "sdist:abc", "set -e", None)
    keys = {ti.task_key(*inputs)}
    for index, other in enumerate(("base-2", "seven", "sdist:abd", "set -x", "wheels")):
        changed = list(inputs)
        changed[index] = other
        keys.add(ti.task_key(*changed))  # type: ignore[arg-type]
    assert len(keys) == 6
    assert all(key.startswith("task-") for key in keys)
    assert ti.task_key(*inputs) == ti.task_key(*inputs)


def test_the_command_line_names_exactly_one_source(tmp_path: Path) -> None:
    assert ti.source_from_args(tmp_path, None, None, None) == ti.TaskSource("dir", str(tmp_path))
    assert ti.source_from_args(None, tmp_path, "v1", None) == ti.TaskSource("git", str(tmp_path), "v1")
    assert ti.source_from_args(None, None, None, "six==1.16.0").kind == "sdist"
    for args, message in [
        ((None, None, None, None), "name the source"),
        ((tmp_path, None, None, "six==1.16.0"), "name one source"),
        ((tmp_path, None, "v1", None), "--rev goes with --git"),
    ]:
        with pytest.raises(ib.BuildError, match=message):
            ti.source_from_args(*args)


def test_sandbox_image_build_reads_the_base_a_task_and_prune(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SANDFLEET_DEBIAN_MIRROR", raising=False)
    base = build_cli.parse_args([])
    assert (base.command, base.mirror) == (None, ib.DEFAULT_MIRROR)  # no command: the base image
    assert build_cli.parse_args(["--json", "prune"]).json
    task = build_cli.parse_args(["task", "--name", "t1", "--workspace", str(tmp_path), "--setup", "make"])
    assert (task.command, task.name, task.workspace, task.setup) == ("task", "t1", tmp_path, "make")


def test_prune_drops_agent_bundle_images_but_the_current_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    current = bundle_image.image_key("bundle", "1.36", "localhost/sandfleet/agent-bundle:1")
    old = bundle_image.image_key("older-bundle", "1.36", "localhost/sandfleet/agent-bundle:1")
    names = [current, old, f".{old}.x1y2", "base-0123", "task-4567", "agent-bundle-abc"]
    for name in names:
        (tmp_path / name).mkdir()
    monkeypatch.setattr(ib, "cache_root", lambda: tmp_path)
    monkeypatch.setattr(bundle_image, "current_key", lambda: current)
    assert bundle_image.prune() == sorted([old, f".{old}.x1y2"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [current, "base-0123", "task-4567", "agent-bundle-abc"]
    )


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_an_sdist_unpacks_its_one_top_directory(tmp_path: Path) -> None:
    archive = _tar(
        tmp_path / "p-1.0.tar.gz", {"p-1.0/PKG-INFO": b"Name: p\n", "p-1.0/tests/test_p.py": b"x = 1\n"}
    )
    dest = tmp_path / "ws"
    dest.mkdir()
    ti.unpack_sdist(archive, dest)
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == [
        "PKG-INFO",
        "tests",
        "tests/test_p.py",
    ]


def test_an_sdist_with_stray_tops_or_escaping_members_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    with pytest.raises(ib.BuildError, match="one top-level directory"):
        ti.unpack_sdist(_tar(tmp_path / "two.tar.gz", {"a/x": b"", "b/y": b""}), tmp_path / "ws")
    with pytest.raises(tarfile.TarError):
        ti.unpack_sdist(_tar(tmp_path / "out.tar.gz", {"p/../../evil": b""}), tmp_path / "ws")
    with zipfile.ZipFile(tmp_path / "p.zip", "w") as zipped:
        zipped.writestr("../evil", "x")
    with pytest.raises(ib.BuildError, match="unsafe member"):
        ti.unpack_sdist(tmp_path / "p.zip", tmp_path / "ws")
    assert not (tmp_path / "evil").exists()


def _git(cwd: Path, *args: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1"}
    identity = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    return subprocess.run(
        ["git", *identity, *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout


def test_a_git_source_is_its_tree_at_the_revision_in_a_fresh_one_commit_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "bug")
    buggy = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    _git(repo, "commit", "-qam", "the fix")
    dest = tmp_path / "ws"
    dest.mkdir()
    assert ti.export_git(repo, buggy[:10], dest) == buggy
    assert (dest / "calc.py").read_text().endswith("a - b\n")
    ti.init_repository(dest, "task")
    assert _git(dest, "log", "--format=%s").splitlines() == ["task"]
    assert "a + b" not in _git(dest, "log", "-p", "--all")
    with pytest.raises(ib.BuildError, match="git checkout"):
        ti.export_git(repo, "no-such-rev", tmp_path / "other")


def test_a_loose_pin_on_the_command_line_is_one_line_and_exit_1(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["task", "build", "six", "--sdist", "six>=1"])
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert "pin it exactly" in result.output


def test_built_images_round_trip_their_record_through_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDFLEET_CACHE", str(tmp_path))
    image = ib.BuiltImage(
        key="task-x", digest="sha256:ab", layout=tmp_path / "l", tag="task-x", archive=tmp_path / "a",
        seconds=1.0, cached=False, log=tmp_path / "x.log", source={"kind": "sdist", "sha256": "cd"},
    )  # fmt: skip
    (ib.cache_root() / "task-x").mkdir(parents=True)
    (ib.cache_root() / "task-x" / "result.json").write_text(json.dumps(image.to_json()))
    assert ib.cached("task-x") == ib.BuiltImage(**{**image.__dict__, "seconds": 0.0, "cached": True})


def test_the_pristine_copy_is_where_the_catalogues_scoring_looks_for_it() -> None:
    # One place each side: the image lays it, the catalogue's scoring names it to the agent.
    from sandfleet.tasks.catalogue import PRISTINE_WORKSPACE

    assert ti.PRISTINE_WORKSPACE == PRISTINE_WORKSPACE
