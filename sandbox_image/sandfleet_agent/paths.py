"""Confines every client-supplied path to the sandbox's working area, following symlinks first."""

from __future__ import annotations

import os
from http import HTTPStatus
from pathlib import Path

from sandfleet_agent.errors import AgentError, bad_request


class Workspace:
    """The directory tree a client may touch; paths resolve relative to it and may not leave it."""

    def __init__(self, root: str | os.PathLike[str], owner: tuple[int, int] | None = None) -> None:
        self.root = Path(os.path.realpath(root))
        # (uid, gid) that files the agent creates for clients get, so the commands can edit them.
        self.owner = owner

    def own(self, path: Path) -> None:
        """Give a path the agent just created to the commands' user (the link itself, for a symlink)."""
        if self.owner is not None:
            os.lchown(path, *self.owner)

    def resolve(self, path: str | None) -> Path:
        """Map a client path (relative to the root, or absolute inside it) to a real path inside it.

        Symlinks are resolved before the check, so a link pointing outside the root is refused too.
        """
        if path is None or path == "":
            return self.root
        if "\x00" in path:
            raise bad_request("path contains a NUL byte", code="bad_path")
        candidate = Path(path) if os.path.isabs(path) else self.root / path
        real = Path(os.path.realpath(candidate))
        if real != self.root and not real.is_relative_to(self.root):
            raise AgentError(
                HTTPStatus.FORBIDDEN,
                "path_outside_root",
                f"path {path!r} resolves outside the working area {str(self.root)!r}",
            )
        return real

    def relative(self, real: Path) -> str:
        """Render a resolved path the way clients name it: relative to the root ('.' for the root)."""
        rel = os.path.relpath(real, self.root)
        return rel
