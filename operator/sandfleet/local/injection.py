"""How the agent is injected into an image sandfleet did not build: pure decisions, no I/O.

An image sandfleet built (`sandbox_image/build`, labelled so) runs its own agent, its entrypoint.
Any other image gets the agent bundle (sandbox_image/agent_bundle.py) mounted read-only at
MOUNT_POINT, and the sandbox's process is the bundle's agent started through the bundle's own
loader, never the image's entrypoint, libc or Python. The image's config still counts: its `Env`
is every command's environment, its `WorkingDir` the working area (exec's default cwd and the
files routes' root). The agent's two users (the commands' and the verifier's) are chosen per
image among uids and gids the image's /etc/passwd and /etc/group do not name. See docs/images.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Where the bundle is mounted in every sandbox of an image sandfleet did not build (read-only).
MOUNT_POINT = "/.sandfleet"
# The label sandbox_image/build puts on its images: they carry the agent themselves.
TITLE_LABEL = "org.opencontainers.image.title"
SANDFLEET_IMAGE_TITLE = "sandfleet-sandbox"
# The agent's users come from here up: far above any uid an image's passwd allocates (Debian's
# dynamic and reserved ranges end below 65536), below the agent's marker groups (0x4000_0000).
AGENT_ID_BASE = 1_000_000
AGENT_ID_LIMIT = 0x4000_0000
# The working area of an image whose WorkingDir is unset or `/` (sandfleet's image has the same).
DEFAULT_WORKING_AREA = "/workspace"
# The homes the agent makes for its users (as sandfleet's image has them).
EXEC_HOME = "/home/sandbox"
VERIFIER_HOME = "/home/verifier"
# The agent process's own PATH (the bundle's agent needs none; the commands get the image's).
AGENT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IMAGE_ENV_VARIABLE = "SANDFLEET_AGENT_IMAGE_ENV"


@dataclass(frozen=True)
class BundleLayout:
    """The bundle's layout, relative to wherever it is mounted (its manifest.json)."""

    loader: str
    library_path: tuple[str, ...]
    python: str


@dataclass(frozen=True)
class AgentUsers:
    """The uids (each its own gid) the agent runs commands and the verifier as, in one image."""

    exec_id: int
    verifier_id: int


@dataclass(frozen=True)
class Injection:
    """How a sandbox of one image runs the injected agent."""

    users: AgentUsers
    working_area: str
    image_env: dict[str, str]


def runs_own_agent(labels: Mapping[str, str]) -> bool:
    """Whether an image carries sandfleet's agent itself (sandbox_image/build made it)."""
    return labels.get(TITLE_LABEL) == SANDFLEET_IMAGE_TITLE


def layout_from_manifest(manifest: Mapping[str, object]) -> BundleLayout:
    """The layout a bundle's manifest.json describes (ValueError if it does not)."""
    library_path = manifest.get("library_path")
    parts = (manifest.get("loader"), manifest.get("python"))
    if not all(isinstance(part, str) and part for part in parts) or not isinstance(library_path, list):
        raise ValueError("the agent bundle's manifest lacks loader, python or library_path")
    return BundleLayout(
        loader=str(parts[0]), library_path=tuple(str(p) for p in library_path), python=str(parts[1])
    )


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


def working_area(workdir: str) -> str:
    """The working area of an image: its WorkingDir, unless that is unset or the filesystem root."""
    cleaned = "/" + "/".join(part for part in workdir.split("/") if part and part != ".")
    if cleaned == "/" or ".." in cleaned.split("/"):
        return DEFAULT_WORKING_AREA
    return cleaned


def image_environment(env: Sequence[str]) -> dict[str, str]:
    """An OCI config's `Env` (KEY=VALUE items, a later one winning) as a mapping."""
    result: dict[str, str] = {}
    for item in env:
        key, sep, value = item.partition("=")
        if sep and key:
            result[key] = value
    return result


def plan_injection(env: Sequence[str], workdir: str, passwd: str | None, group: str | None) -> Injection:
    """Everything a sandbox of the image needs to run the injected agent, from the image's own facts."""
    return Injection(
        users=choose_agent_users(passwd, group),
        working_area=working_area(workdir),
        image_env=image_environment(env),
    )


def agent_argv(layout: BundleLayout, injection: Injection, port: int, mount: str = MOUNT_POINT) -> list[str]:
    """The sandbox's process: the bundle's agent, through the bundle's loader, on its libraries only."""
    users = injection.users
    return [
        f"{mount}/{layout.loader}",
        "--library-path",
        ":".join(f"{mount}/{part}" for part in layout.library_path),
        f"{mount}/{layout.python}",
        "-I",  # no PYTHON* variable, no user site, no script directory on the path
        "-S",
        "-m",
        "sandfleet_agent",
        *("--port", str(port)),
        *("--root", injection.working_area),
        *("--exec-user", f"{users.exec_id}:{users.exec_id}"),
        *("--verifier-user", f"{users.verifier_id}:{users.verifier_id}"),
        *("--bundle", mount),
    ]


def agent_env(injection: Injection, extra: Mapping[str, str]) -> list[str]:
    """The agent process's environment: none of the image's (that goes to the commands, as JSON).

    Nothing an image sets (LD_PRELOAD, LD_LIBRARY_PATH, PYTHONPATH...) reaches the agent itself.
    """
    image_env = json.dumps(injection.image_env, sort_keys=True)
    return [
        f"PATH={AGENT_PATH}",
        *(f"{key}={value}" for key, value in extra.items() if key not in ("PATH", IMAGE_ENV_VARIABLE)),
        f"{IMAGE_ENV_VARIABLE}={image_env}",
    ]
