"""Confines every client-supplied path to the sandbox's working area, following symlinks first."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
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

    def open_dir(self, directory: Path, *, create: bool = False) -> int:
        """A descriptor of a resolved directory, reached from the root one name at a time, no link followed.

        The agent is root in the sandbox and the tree is the sandbox user's: between resolving a
        path and using it, a command could swap a directory for a link to anywhere. Every write
        happens relative to a descriptor from here, so a swap makes the request fail, never
        write outside. With `create`, missing directories are made and given to the owner.
        """
        try:
            parts = directory.relative_to(self.root).parts
        except ValueError:
            raise AgentError(
                HTTPStatus.FORBIDDEN, "path_outside_root", f"{str(directory)!r} is outside the working area"
            ) from None
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.root, flags)
        try:
            for part in parts:
                try:
                    child = os.open(part, flags, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                        if self.owner is not None:
                            os.chown(part, *self.owner, dir_fd=fd, follow_symlinks=False)
                    child = os.open(part, flags, dir_fd=fd)
                except OSError as error:
                    # O_NOFOLLOW|O_DIRECTORY on a link fails with ELOOP or (Linux) ENOTDIR.
                    if error.errno == errno.ELOOP or (error.errno == errno.ENOTDIR and _is_link(part, fd)):
                        raise AgentError(
                            HTTPStatus.CONFLICT,
                            "path_changed",
                            f"{part!r} in {self.relative(directory)!r} became a link while the agent "
                            "used it; retry",
                        ) from None
                    raise
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def relative(self, real: Path) -> str:
        """Render a resolved path the way clients name it: relative to the root ('.' for the root)."""
        rel = os.path.relpath(real, self.root)
        return rel


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False
