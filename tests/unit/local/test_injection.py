"""How the agent is injected into an image sandfleet did not build: users, working area, environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandfleet.core.agent_tokens import AGENT_TOKEN_ENV
from sandfleet.local.image import read_image_file
from sandfleet.local.injection import (
    AGENT_ID_BASE,
    DEFAULT_WORKING_AREA,
    IMAGE_ENV_VARIABLE,
    MOUNT_POINT,
    AgentUsers,
    BundleLayout,
    ImageUser,
    agent_argv,
    agent_env,
    choose_agent_users,
    image_environment,
    layout_from_manifest,
    plan_injection,
    resolve_image_user,
    runs_own_agent,
    working_area,
)

LAYOUT = BundleLayout(loader="lib64/ld-linux-x86-64.so.2", library_path=("lib",), python="usr/bin/python3.11")


def test_agent_users_avoid_every_id_the_image_names() -> None:
    assert choose_agent_users(None, None) == AgentUsers(AGENT_ID_BASE, AGENT_ID_BASE + 1)
    passwd = "root:x:0:0::/root:/bin/sh\nbroken line\nx:x:notanumber:0::/:\n"
    passwd += f"squat:x:{AGENT_ID_BASE}:5::/:/bin/sh\n"
    group = f"root:x:0:\nteam:x:{AGENT_ID_BASE + 2}:\n"
    # uid = gid for each: an id taken as a group is skipped too.
    assert choose_agent_users(passwd, group) == AgentUsers(AGENT_ID_BASE + 1, AGENT_ID_BASE + 3)
    # The ids sandfleet's own image uses (1000, 1001) are never picked.
    assert 1000 not in {*choose_agent_users("a:x:1000:1000::/:\n", None).__dict__.values()}
    with pytest.raises(ValueError, match="no two free ids"):
        choose_agent_users(f"a:x:{AGENT_ID_BASE}:0::/:\n", None, limit=AGENT_ID_BASE + 2)


@pytest.mark.parametrize(
    ("workdir", "area"),
    [
        ("/testbed", "/testbed"),
        ("/srv/work/", "/srv/work"),
        ("srv//./work", "/srv/work"),
        ("/", DEFAULT_WORKING_AREA),
        ("", DEFAULT_WORKING_AREA),
        ("/srv/../etc", DEFAULT_WORKING_AREA),
    ],
)
def test_the_working_area_is_the_images_workdir_unless_it_is_the_root(workdir: str, area: str) -> None:
    assert working_area(workdir) == area


def test_the_image_environment_is_read_as_a_runtime_reads_it() -> None:
    env = image_environment(["PATH=/a:/b", "EMPTY=", "NOEQUALS", "=nokey", "X=1", "X=2=3"])
    assert env == {"PATH": "/a:/b", "EMPTY": "", "X": "2=3"}


def test_the_agent_starts_through_the_bundles_loader_with_nothing_in_its_environment() -> None:
    image_env = ["PATH=/opt/x/bin", "LD_PRELOAD=/lib/evil.so", "LD_LIBRARY_PATH=/image/lib", "PYTHONPATH=/p"]
    injection = plan_injection(image_env, "/testbed", None, None)
    argv = agent_argv(LAYOUT, injection, 8000)
    assert argv[:4] == [
        f"{MOUNT_POINT}/lib64/ld-linux-x86-64.so.2",
        "--library-path",
        f"{MOUNT_POINT}/lib",
        f"{MOUNT_POINT}/usr/bin/python3.11",
    ]
    assert argv[4:8] == ["-I", "-S", "-m", "sandfleet_agent"]
    options = dict(zip(argv[8::2], argv[9::2], strict=True))
    assert options == {
        "--port": "8000",
        "--root": "/testbed",
        "--exec-user": f"{AGENT_ID_BASE}:{AGENT_ID_BASE}",
        "--verifier-user": f"{AGENT_ID_BASE + 1}:{AGENT_ID_BASE + 1}",
        "--bundle": MOUNT_POINT,
    }
    env = agent_env(injection, {AGENT_TOKEN_ENV: "secret", "PATH": "/ignored"})
    names = [item.split("=", 1)[0] for item in env]
    # The image's variables reach the agent only as the commands' environment, never its own.
    assert sorted(names) == sorted(["PATH", AGENT_TOKEN_ENV, IMAGE_ENV_VARIABLE])
    assert "PATH=/ignored" not in env
    passed = json.loads(next(item for item in env if item.startswith(IMAGE_ENV_VARIABLE)).split("=", 1)[1])
    assert passed == image_environment(image_env)


def test_only_sandfleets_own_images_carry_the_agent() -> None:
    assert runs_own_agent({"org.opencontainers.image.title": "sandfleet-sandbox"})
    assert not runs_own_agent({"org.opencontainers.image.title": "busybox"})
    assert not runs_own_agent({})


def test_the_bundle_manifest_must_say_how_to_start_the_agent() -> None:
    manifest = {"loader": LAYOUT.loader, "library_path": ["lib"], "python": LAYOUT.python}
    assert layout_from_manifest(manifest) == LAYOUT
    for broken in ({**manifest, "loader": ""}, {**manifest, "library_path": "lib"}, {}):
        with pytest.raises(ValueError, match="manifest"):
            layout_from_manifest(broken)


def test_an_images_passwd_is_read_without_following_its_links(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    assert read_image_file(rootfs, "etc/passwd") == "root:x:0:0::/root:/bin/sh\n"
    assert read_image_file(rootfs, "etc/group") is None
    secret = tmp_path / "host-secret"
    secret.write_text("the host's\n")
    (rootfs / "etc" / "group").symlink_to(secret)  # a link out of the image: not followed
    assert read_image_file(rootfs, "etc/group") is None
    other = tmp_path / "other"
    (other / "etc").mkdir(parents=True)
    (other / "etc" / "passwd").write_text("x")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "etc").symlink_to(other / "etc")  # a linked directory on the way is refused too
    assert read_image_file(linked, "etc/passwd") is None
    (rootfs / "etc" / "dir").mkdir()
    assert read_image_file(rootfs, "etc/dir") is None


PASSWD = (
    "root:x:0:0:root:/root:/bin/sh\napp:x:1001:1002:App:/home/app:/bin/sh\n# a comment\n"
    "nobody:x:65534:65534::/nonexistent:/bin/false\n"
)
GROUP = "root:x:0:\nstaff:x:50:\napp:x:1002:\n"


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ("", ImageUser(0, 0, "/root")),
        ("root", ImageUser(0, 0, "/root")),
        ("0", ImageUser(0, 0, "/root")),
        ("app", ImageUser(1001, 1002, "/home/app")),
        ("1001", ImageUser(1001, 1002, "/home/app")),
        ("app:staff", ImageUser(1001, 50, "/home/app")),
        ("app:7", ImageUser(1001, 7, "/home/app")),
        ("4242", ImageUser(4242, 0, "/")),  # a number need not be in passwd, as with runc
        ("4242:4242", ImageUser(4242, 4242, "/")),
    ],
)
def test_the_images_user_is_resolved_as_runc_does(user: str, expected: ImageUser) -> None:
    assert resolve_image_user(user, PASSWD, GROUP) == expected


@pytest.mark.parametrize(("user", "named"), [("ghost", "'ghost'"), ("app:ghosts", "group 'ghosts'")])
def test_a_name_the_image_does_not_have_is_refused(user: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        resolve_image_user(user, PASSWD, GROUP)
    with pytest.raises(ValueError, match="does not"):
        resolve_image_user(user, None, None)  # no /etc/passwd at all (distroless, busybox)
    assert resolve_image_user("root", None, None) == ImageUser(0, 0, "/root")  # root needs no passwd


def test_commands_as_the_images_user_pass_root_by_name_and_others_with_their_home() -> None:
    def exec_user(user: str) -> str:
        injection = plan_injection([], "/testbed", PASSWD, GROUP, resolve_image_user(user, PASSWD, GROUP))
        argv = agent_argv(LAYOUT, injection, 8000)
        return argv[argv.index("--exec-user") + 1]

    assert exec_user("") == "root"
    assert exec_user("app") == "1001:1002:/home/app"
