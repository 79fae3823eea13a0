"""The agent's own programs from the bundle, and the environment an image's commands get."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandfleet_agent import command, programs
from sandfleet_agent.server import image_environment
from sandfleet_agent.users import Identity

MANIFEST: dict[str, object] = {
    "loader": "lib64/ld-linux-x86-64.so.2",
    "library_path": ["lib", "lib2"],
    "python": "usr/bin/python3.11",
    "git": "usr/bin/git",
    "setpriv": "usr/bin/setpriv",
    "true": "usr/bin/true",
}


@pytest.fixture
def bundle(tmp_path: Path) -> Iterator[programs.Bundle]:
    (tmp_path / "manifest.json").write_text(json.dumps(MANIFEST))
    found = programs.read_bundle(tmp_path)
    programs.use_bundle(found)
    try:
        yield found
    finally:
        programs.use_bundle(None)


def test_the_image_programs_without_a_bundle() -> None:
    assert not programs.from_bundle()
    assert programs.setpriv() == ["/usr/bin/setpriv"]
    assert programs.git() == ["git"]
    assert programs.ready_check() == ["true"]
    env = {"PATH": "/bin", "LD_PRELOAD": "/x.so"}
    assert programs.own_program_env(env) == env
    assert command.switch_by_setpriv(env)


def test_the_bundles_programs_run_on_its_loader_with_an_argument_not_a_variable(
    bundle: programs.Bundle,
) -> None:
    root = bundle.root
    prefix = [str(root / "lib64/ld-linux-x86-64.so.2"), "--library-path", f"{root}/lib:{root}/lib2"]
    assert programs.git() == [*prefix, str(root / "usr/bin/git")]
    assert programs.setpriv() == [*prefix, str(root / "usr/bin/setpriv")]
    assert programs.ready_check() == [*prefix, str(root / "usr/bin/true")]
    assert programs.python() == [*prefix, str(root / "usr/bin/python3.11"), "-I"]
    # The image's preload is for the image's libc: never loaded into the bundle's programs.
    env = {"PATH": "/bin", "LD_PRELOAD": "/x.so", "LD_AUDIT": "/y.so", "HOME": "/h"}
    assert programs.own_program_env(env) == {"PATH": "/bin", "HOME": "/h"}
    assert not command.switch_by_setpriv(env)  # the forked agent switches users for that command
    assert command.switch_by_setpriv({"PATH": "/bin"})


def test_a_bundle_without_a_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no usable agent bundle"):
        programs.read_bundle(tmp_path)


def test_commands_get_the_images_environment_and_their_users_home() -> None:
    user = Identity(uid=1_000_000, gid=1_000_000, home="/home/sandbox")
    image = {"PATH": "/opt/bin", "MARKER": "x", "HOME": "/root"}
    assert image_environment(image, user) == {"PATH": "/opt/bin", "MARKER": "x", "HOME": "/home/sandbox"}
    assert image_environment({}, None) == {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
    }
