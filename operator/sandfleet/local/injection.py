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

# The rules the agent applies itself on Kubernetes (`--exec-user auto`, `--root auto`) live with
# it, the one source for both runtimes; the `X as X` names are re-exported for this module's users.
from sandfleet_agent.image_config import AGENT_ID_BASE as AGENT_ID_BASE
from sandfleet_agent.image_config import AGENT_ID_LIMIT as AGENT_ID_LIMIT
from sandfleet_agent.image_config import DEFAULT_WORKING_AREA as DEFAULT_WORKING_AREA
from sandfleet_agent.image_config import AgentUsers as AgentUsers
from sandfleet_agent.image_config import ImageUser as ImageUser
from sandfleet_agent.image_config import choose_agent_users as choose_agent_users
from sandfleet_agent.image_config import ids_named as ids_named
from sandfleet_agent.image_config import resolve_image_user as resolve_image_user
from sandfleet_agent.image_config import working_area as working_area

# Where the bundle is mounted in every sandbox of an image sandfleet did not build (read-only).
MOUNT_POINT = "/.sandfleet"
# The label sandbox_image/build puts on its images: they carry the agent themselves.
TITLE_LABEL = "org.opencontainers.image.title"
SANDFLEET_IMAGE_TITLE = "sandfleet-sandbox"
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
class Injection:
    """How a sandbox of one image runs the injected agent."""

    users: AgentUsers
    working_area: str
    image_env: dict[str, str]
    # Commands run as the image's own User (a pool asked for it), not as the agent's exec user.
    image_user: ImageUser | None = None


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


def image_environment(env: Sequence[str]) -> dict[str, str]:
    """An OCI config's `Env` (KEY=VALUE items, a later one winning) as a mapping."""
    result: dict[str, str] = {}
    for item in env:
        key, sep, value = item.partition("=")
        if sep and key:
            result[key] = value
    return result


def plan_injection(
    env: Sequence[str],
    workdir: str,
    passwd: str | None,
    group: str | None,
    image_user: ImageUser | None = None,
) -> Injection:
    """Everything a sandbox of the image needs to run the injected agent, from the image's own facts."""
    return Injection(
        users=choose_agent_users(passwd, group),
        working_area=working_area(workdir),
        image_env=image_environment(env),
        image_user=image_user,
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
        "--exec-user",
        injection.image_user.exec_user() if injection.image_user else f"{users.exec_id}:{users.exec_id}",
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
