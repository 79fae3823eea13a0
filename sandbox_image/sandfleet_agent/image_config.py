"""An image's facts as the injected agent uses them: its users' ids, its working area, its Env (pure).

The one home of these rules for both runtimes. The local runtime reads the image from the host
and passes the results as flags (`sandfleet/local/injection.py` imports them from here); on
Kubernetes the agent learns them inside the sandbox at start (`--root auto`, `--exec-user auto`,
`--verifier-user auto`, `--image-env auto`), since there the runtime, not sandfleet, unpacks the
image. Standard library only and no I/O, so `sandfleet` may import it without importing the agent.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# The agent's users come from here up: far above any uid an image's passwd allocates (Debian's
# dynamic and reserved ranges end below 65536), below the agent's marker groups (0x4000_0000).
AGENT_ID_BASE = 1_000_000
AGENT_ID_LIMIT = 0x4000_0000
# The working area of an image whose WorkingDir is unset or `/` (sandfleet's image has the same).
DEFAULT_WORKING_AREA = "/workspace"
# Variables in the agent's own namespace: what a Pod adds for the agent (its token, the pristine
# copy's directory) and what the launcher moves aside. Never the image's, never a command's.
AGENT_VARIABLE_PREFIX = "SANDFLEET_AGENT_"
# Where the launcher (the agent bundle image's bin/agent) keeps the environment the container was
# started with, before its shell added PWD and SHLVL: base64 of the NUL-separated KEY=VALUE list.
STARTED_ENVIRON_VARIABLE = "SANDFLEET_AGENT_STARTED_ENVIRON"
# What the kubelet adds to every container whatever the Pod says (enableServiceLinks covers only
# the other Services): the `kubernetes` Service's address.
KUBELET_SERVICE_PREFIXES = ("KUBERNETES_SERVICE_", "KUBERNETES_PORT")


@dataclass(frozen=True)
class AgentUsers:
    """The uids (each its own gid) the agent runs commands and the verifier as, in one image."""

    exec_id: int
    verifier_id: int


def ids_named(table: str | None) -> set[int]:
    """The numeric ids (third field) of an /etc/passwd or /etc/group text; None is an absent file."""
    found: set[int] = set()
    for line in (table or "").splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[2].strip().isdigit():
            found.add(int(fields[2].strip()))
    return found


def choose_agent_users(
    passwd: str | None, group: str | None, base: int = AGENT_ID_BASE, limit: int = AGENT_ID_LIMIT
) -> AgentUsers:
    """The first two ids from `base` that no user and no group of the image has (uid = gid each)."""
    taken = ids_named(passwd) | ids_named(group)
    free: list[int] = []
    candidate = base
    while len(free) < 2:
        if candidate >= limit:
            raise ValueError(f"no two free ids between {base} and {limit} in the image's passwd and group")
        if candidate not in taken:
            free.append(candidate)
        candidate += 1
    return AgentUsers(exec_id=free[0], verifier_id=free[1])


# Where root's programs and lookups read from. The working area's directory is given to the
# commands' user, so it must be none of these: in /etc, say, that user could add /etc/ld.so.preload
# and every program root then starts (the agent's own git and setpriv among them) would load it.
SYSTEM_TREES = (
    *("/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/dev", "/proc", "/sys"),
    *("/run", "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec"),
)
# Directories that may hold a working area below them (/usr/src/app, /var/www) but are none.
SYSTEM_PARENTS = ("/usr", "/usr/local", "/var", "/var/lib")


def system_directory(path: str) -> bool:
    """Whether `path` (absolute) is a system directory or inside one: never a working area."""
    clean = "/" + "/".join(part for part in path.split("/") if part not in ("", "."))
    return clean in SYSTEM_PARENTS or any(
        clean == tree or clean.startswith(tree + "/") for tree in SYSTEM_TREES
    )


def working_area(workdir: str) -> str:
    """The working area of an image: its WorkingDir, unless that is unset or the filesystem root."""
    cleaned = "/" + "/".join(part for part in workdir.split("/") if part and part != ".")
    if cleaned == "/" or ".." in cleaned.split("/"):
        return DEFAULT_WORKING_AREA
    return cleaned


@dataclass(frozen=True)
class ImageUser:
    """The image's own `User`, as runc resolves it against the image's /etc/passwd and /etc/group."""

    uid: int
    gid: int
    home: str

    def exec_user(self) -> str:
        """The agent's `--exec-user` for it: `root` by name (never a default), else UID:GID:HOME."""
        return "root" if self.uid == 0 else f"{self.uid}:{self.gid}:{self.home}"


def _table(text: str | None) -> list[list[str]]:
    return [line.split(":") for line in (text or "").splitlines() if line and not line.startswith("#")]


def resolve_image_user(user: str, passwd: str | None, group: str | None) -> ImageUser:
    """An OCI config's `User` (`name`, `uid`, `name:group`, `uid:gid`; empty is root) as runc reads it.

    A name must be in the image's /etc/passwd (a group name in its /etc/group), else ValueError
    saying so; a number need not be, as with runc (its group is then the passwd entry's, else 0).
    `root` is uid 0 even in an image with no /etc/passwd (busybox-only, scratch).
    """
    name, _, group_part = (user or "0").partition(":")
    if name == "root" and not any(f[0] == "root" for f in _table(passwd)):
        name = "0"
    users = _table(passwd)
    entry = next(
        (f for f in users if len(f) >= 7 and (f[0] == name or (name.isdigit() and f[2] == name))), None
    )
    if name.isdigit():
        uid = int(name)
    elif entry is not None and entry[2].isdigit():
        uid = int(entry[2])
    else:
        raise ValueError(
            f"its User {user!r} names {name!r}, which its /etc/passwd does not: use a uid or add the user"
        )
    gid = int(entry[3]) if entry is not None and entry[3].isdigit() else 0
    if group_part:
        if group_part.isdigit():
            gid = int(group_part)
        else:
            found = next(
                (f for f in _table(group) if len(f) >= 3 and f[0] == group_part and f[2].isdigit()), None
            )
            if found is None:
                raise ValueError(
                    f"its User {user!r} names group {group_part!r}, which its /etc/group does not: use a gid"
                )
            gid = int(found[2])
    home = entry[5] if entry is not None and entry[5].startswith("/") else ("/root" if uid == 0 else "/")
    return ImageUser(uid=uid, gid=gid, home=home)


def decode_started_environ(value: str) -> list[str]:
    """The launcher's copy of the container's first environment: KEY=VALUE items (ValueError if bad)."""
    try:
        raw = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError(f"{STARTED_ENVIRON_VARIABLE} is not base64") from None
    return [item.decode("utf-8", "surrogateescape") for item in raw.split(b"\0") if item]


def _added_for_the_sandbox(name: str) -> bool:
    return name.startswith(AGENT_VARIABLE_PREFIX) or name.startswith(KUBELET_SERVICE_PREFIXES)


def image_env_from_container(items: Iterable[str]) -> dict[str, str]:
    """The image's Env (and the pool's), from a container's environment: what the Pod added removed.

    The kubelet merges the image's Env with the container's `env` (the pool's variables win, as a
    pool means them to) and adds the `kubernetes` Service's address; the operator adds the agent's
    own variables. The last two are not the image's: they are dropped. A later item wins.
    """
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if sep and name and not _added_for_the_sandbox(name):
            env[name] = value
    return env


def agent_own_environment(environ: Mapping[str, str], path: str) -> dict[str, str]:
    """The agent process's own environment once it has read the image's: its variables and PATH.

    None of the image's variables applies to the agent itself (as on the local runtime).
    """
    own = {name: value for name, value in environ.items() if name.startswith(AGENT_VARIABLE_PREFIX)}
    own.pop(STARTED_ENVIRON_VARIABLE, None)
    own["PATH"] = path
    return own
