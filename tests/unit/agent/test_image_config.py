"""The agent learns an image's config itself on Kubernetes (`auto`): the env, the users, the working area."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from sandfleet.local import injection
from sandfleet_agent import __main__ as agent_main
from sandfleet_agent import image_config
from sandfleet_agent.image_config import (
    AGENT_ID_BASE,
    STARTED_ENVIRON_VARIABLE,
    AgentUsers,
    agent_own_environment,
    choose_agent_users,
    decode_started_environ,
    image_env_from_container,
)
from sandfleet_agent.image_files import MAX_IMAGE_FILE_BYTES
from sandfleet_agent.server import DEFAULT_PATH

# What a kubelet hands the sandbox container: the image's Env, the pool's env, the agent's token
# and the kubernetes Service's address.
CONTAINER_ENV = [
    "PATH=/opt/conda/bin:/usr/bin:/bin",
    "LD_PRELOAD=/opt/lib/libfast.so",
    "MARKER=from-the-image",
    "POOL_VAR=from-the-pool",
    "SANDFLEET_AGENT_TOKEN=secret",
    "SANDFLEET_AGENT_PRISTINE_DIR=/var/lib/sandfleet-agent/pristine",
    "KUBERNETES_SERVICE_HOST=10.96.0.1",
    "KUBERNETES_SERVICE_PORT=443",
    "KUBERNETES_SERVICE_PORT_HTTPS=443",
    "KUBERNETES_PORT=tcp://10.96.0.1:443",
    "KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1",
    "HOSTNAME=pool-abc",
    "MULTI=line one\nLD_FAKE=not a variable",
]


def test_the_local_runtime_uses_the_agents_rules() -> None:
    # One source: the local runtime's names are the agent's own objects, not copies.
    assert injection.choose_agent_users is choose_agent_users
    assert injection.working_area is image_config.working_area
    assert injection.AGENT_ID_BASE == AGENT_ID_BASE


def test_the_image_env_is_the_containers_without_what_the_pod_added() -> None:
    env = image_env_from_container(CONTAINER_ENV)
    assert env == {
        "PATH": "/opt/conda/bin:/usr/bin:/bin",
        "LD_PRELOAD": "/opt/lib/libfast.so",
        "MARKER": "from-the-image",
        "POOL_VAR": "from-the-pool",
        "HOSTNAME": "pool-abc",
        "MULTI": "line one\nLD_FAKE=not a variable",
    }


def test_the_launchers_copy_is_read_back_exactly() -> None:
    raw = b"".join(item.encode() + b"\0" for item in CONTAINER_ENV)
    assert decode_started_environ(base64.b64encode(raw).decode()) == CONTAINER_ENV
    with pytest.raises(ValueError, match="base64"):
        decode_started_environ("not base64!")


def test_the_agent_keeps_only_its_own_variables_and_a_fixed_path() -> None:
    environ = dict(item.split("=", 1) for item in CONTAINER_ENV[:7]) | {STARTED_ENVIRON_VARIABLE: "x"}
    assert agent_own_environment(environ, "/usr/bin:/bin") == {
        "PATH": "/usr/bin:/bin",
        "SANDFLEET_AGENT_TOKEN": "secret",
        "SANDFLEET_AGENT_PRISTINE_DIR": "/var/lib/sandfleet-agent/pristine",
    }


def test_auto_image_env_reads_the_launchers_copy_and_clears_the_agents_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw = b"".join(item.encode() + b"\0" for item in CONTAINER_ENV)
    monkeypatch.setattr(os, "environ", {"SHLVL": "1", "PWD": "/srv", "SANDFLEET_AGENT_TOKEN": "secret"})
    os.environ[STARTED_ENVIRON_VARIABLE] = base64.b64encode(raw).decode()
    env = agent_main.auto_image_env()
    # The shell's own PWD and SHLVL are not the image's; the loader's variables are.
    assert "SHLVL" not in env
    assert env["LD_PRELOAD"] == "/opt/lib/libfast.so"
    assert "SANDFLEET_AGENT_TOKEN" not in env
    assert dict(os.environ) == {"SANDFLEET_AGENT_TOKEN": "secret", "PATH": DEFAULT_PATH}


def test_users_are_chosen_from_the_images_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    passwd = f"root:x:0:0::/root:/bin/sh\nsquatter:x:{AGENT_ID_BASE}:{AGENT_ID_BASE}::/:/bin/sh\n"
    assert choose_agent_users(passwd, None) == AgentUsers(AGENT_ID_BASE + 1, AGENT_ID_BASE + 2)
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text(passwd)
    (etc / "group").symlink_to("/etc/group")  # a link is never followed: it names nothing
    tables = {"/etc/passwd": etc / "passwd", "/etc/group": etc / "group"}
    real = agent_main.read_image_table
    monkeypatch.setattr(agent_main, "read_image_table", lambda path: real(str(tables[path])))
    assert agent_main.auto_users() == (
        f"{AGENT_ID_BASE + 1}:{AGENT_ID_BASE + 1}",
        f"{AGENT_ID_BASE + 2}:{AGENT_ID_BASE + 2}",
    )


def test_reading_an_image_table_follows_no_link_and_refuses_what_is_not_a_small_file(tmp_path: Path) -> None:
    (tmp_path / "passwd").write_text("a:x:5:5::/:/bin/sh\n")
    (tmp_path / "link").symlink_to(tmp_path / "passwd")
    (tmp_path / "dir").mkdir()
    assert agent_main.read_image_table(str(tmp_path / "passwd")) == "a:x:5:5::/:/bin/sh\n"
    assert agent_main.read_image_table(str(tmp_path / "link")) is None
    assert agent_main.read_image_table(str(tmp_path / "dir")) is None
    assert agent_main.read_image_table(str(tmp_path / "absent")) is None
    (tmp_path / "big").write_bytes(b"x" * (MAX_IMAGE_FILE_BYTES + 1))
    assert agent_main.read_image_table(str(tmp_path / "big")) is None


@pytest.mark.parametrize(
    ("cwd", "area"), [("/", "/workspace"), ("/testbed", "/testbed"), ("/srv/work/", "/srv/work")]
)
def test_the_working_area_is_the_start_directory_unless_it_is_the_root(cwd: str, area: str) -> None:
    assert image_config.working_area(cwd) == area


def test_auto_users_come_in_pairs() -> None:
    assert (
        agent_main.main(["--exec-user", "auto", "--verifier-user", "1001:1001", "--insecure-no-token"]) == 2
    )


def test_image_user_is_resolved_by_the_images_own_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = {
        "/etc/passwd": "root:x:0:0::/root:/bin/sh\napp:x:1001:1002::/home/app:/bin/sh\n",
        "/etc/group": "root:x:0:\napp:x:1002:\n",
    }
    monkeypatch.setattr(agent_main, "read_image_table", lambda path: tables[path])
    assert agent_main.image_user("root") == "root"
    assert agent_main.image_user("") == "root"
    assert agent_main.image_user("app") == "1001:1002:/home/app"
    with pytest.raises(ValueError, match="'ghost'"):
        agent_main.image_user("ghost")
    # The verifier is still one of the ids the image does not name; a name it lacks stops the agent.
    assert (
        agent_main.main(["--exec-user", "image:ghost", "--verifier-user", "auto", "--insecure-no-token"]) == 2
    )


@pytest.mark.parametrize(
    "path", ["/etc", "/etc/app", "/usr/lib/x", "/bin", "/lib64", "/proc/1", "/usr", "/var", "/usr/local"]
)
def test_a_system_directory_is_never_a_working_area(path: str) -> None:
    assert image_config.system_directory(path)
    assert image_config.system_directory(path + "/")


@pytest.mark.parametrize(
    "path", ["/testbed", "/workspace", "/usr/src/app", "/var/www/html", "/opt/app", "/root"]
)
def test_a_tasks_own_directory_is_a_working_area(path: str) -> None:
    assert not image_config.system_directory(path)


def test_the_agent_refuses_a_system_directory_as_its_working_area() -> None:
    assert agent_main.main(["--root", "/etc", "--insecure-no-token"]) == 2
