"""The programs the agent itself runs (its own Python, git, setpriv): the bundle's, or the image's.

An agent started from the agent bundle (`--bundle`, see sandbox_image/agent_bundle.py) runs each
of them through the bundle's own loader with `--library-path`: an argument of that one process,
so nothing the command they start inherits (its environment above all) names the bundle. An agent
built into the image uses the image's programs, as it always did.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# util-linux's setpriv (Essential in Debian, so in every image built on sandfleet's).
IMAGE_SETPRIV = "/usr/bin/setpriv"
IMAGE_GIT = "git"


@dataclass(frozen=True)
class Bundle:
    """Where the bundle is mounted and its layout (its manifest.json)."""

    root: Path
    loader: str
    library_path: tuple[str, ...]
    python: str
    git: str
    setpriv: str
    true: str

    def runner(self, program: str) -> list[str]:
        """The argv prefix that runs one of the bundle's programs on the bundle's libraries only."""
        libraries = ":".join(str(self.root / part) for part in self.library_path)
        return [str(self.root / self.loader), "--library-path", libraries, str(self.root / program)]


_bundle: Bundle | None = None


def read_bundle(root: Path) -> Bundle:
    """The bundle mounted at `root` (ValueError if its manifest is missing or malformed)."""
    try:
        manifest = json.loads((root / "manifest.json").read_text())
        return Bundle(
            root=root,
            loader=str(manifest["loader"]),
            library_path=tuple(str(part) for part in manifest["library_path"]),
            python=str(manifest["python"]),
            git=str(manifest["git"]),
            setpriv=str(manifest["setpriv"]),
            true=str(manifest["true"]),
        )
    except (OSError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"no usable agent bundle at {root}: {error}") from None


def use_bundle(bundle: Bundle | None) -> None:
    """Run the agent's own programs from `bundle` (None: the image's); set once, at start."""
    global _bundle
    _bundle = bundle


def from_bundle() -> bool:
    """Whether the agent runs from the bundle (in an image sandfleet did not build)."""
    return _bundle is not None


def setpriv() -> list[str]:
    """The argv prefix of setpriv."""
    return [IMAGE_SETPRIV] if _bundle is None else _bundle.runner(_bundle.setpriv)


def git() -> list[str]:
    """The argv prefix of git (evaluate's `git apply`)."""
    return [IMAGE_GIT] if _bundle is None else _bundle.runner(_bundle.git)


def ready_check() -> list[str]:
    """What readiness runs as the commands' user: the image's `true`, or the bundle's.

    An image without one of its own (distroless) must be ready too.
    """
    return ["true"] if _bundle is None else _bundle.runner(_bundle.true)


def python() -> list[str]:
    """The argv prefix of the agent's own interpreter, isolated from the environment and site."""
    return [sys.executable] if _bundle is None else [*_bundle.runner(_bundle.python), "-I"]


def own_program_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment for one of the agent's own programs (git), from a command's.

    The bundle's loader must not preload what the image's environment names for the image's libc
    (`LD_PRELOAD`, `LD_AUDIT`...).
    """
    if _bundle is None:
        return dict(env)
    return {name: value for name, value in env.items() if not name.startswith("LD_")}
