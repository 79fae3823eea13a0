"""Confines every client-supplied path to the working area (or an extra root), following symlinks first."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from http import HTTPStatus
from pathlib import Path

from sandfleet_agent.errors import AgentError, bad_request


class Workspace:
    """The directory tree a client may touch; paths resolve relative to it and may not leave it.

    `extra_roots` are further absolute directories a client may also reach by absolute path
    (Harbor's `/tests`, `/logs`, `/solution`). Unlike the working area they stay root's: what
    the agent writes there is not given to the commands' user, so the episode's code cannot
    rewrite the tests it is graded by. A missing extra root is made (root's, 0755) on first write.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        owner: tuple[int, int] | None = None,
        extra_roots: tuple[str | os.PathLike[str], ...] = (),
    ) -> None:
        self.root = Path(os.path.realpath(root))
        # (uid, gid) that files the agent creates for clients get, so the commands can edit them.
        self.owner = owner
        self.extra_roots = tuple(Path(os.path.abspath(extra)) for extra in extra_roots)

    def own(self, path: Path) -> None:
        """Give a path the agent just created to the commands' user (the link itself, for a symlink)."""
        owner = self.owner_for(path)
        if owner is not None:
            os.lchown(path, *owner)

    def owner_for(self, path: Path) -> tuple[int, int] | None:
        """Who a file the agent creates at `path` belongs to: the commands' user only in the working area."""
        return self.owner if self.in_working_area(path) else None

    def in_working_area(self, path: Path) -> bool:
        """Whether `path` lies in the working area proper (not in an extra root)."""
        return self._base_of(path) == self.root

    def is_base(self, path: Path) -> bool:
        """Whether `path` is the working area or an extra root itself (never written or deleted whole)."""
        return path == self.root or path in self.extra_roots

    def contains(self, real: Path) -> bool:
        """Whether a resolved path lies in the working area or an extra root."""
        return self._base_of(real) is not None

    def _base_of(self, real: Path) -> Path | None:
        for base in (self.root, *self.extra_roots):
            if real == base or real.is_relative_to(base):
                if base != self.root and os.path.realpath(base) != str(base):
                    # An extra root that is itself a link would send writes wherever it points.
                    return None
                return base
        return None

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
        if not self.contains(real):
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
        base = self._base_of(directory)
        if base is None:
            raise AgentError(
                HTTPStatus.FORBIDDEN, "path_outside_root", f"{str(directory)!r} is outside the working area"
            )
        parts = directory.relative_to(base).parts
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        if create and base != self.root:
            with contextlib.suppress(FileExistsError):
                os.mkdir(base, 0o755)
        fd = os.open(base, flags)
        owner = self.owner if base == self.root else None
        try:
            for part in parts:
                try:
                    child = os.open(part, flags, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                        if owner is not None:
                            os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
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
        """Render a resolved path the way clients name it: relative to the root ('.' for the root).

        A path in an extra root is rendered absolute, as the client named it.
        """
        if self._base_of(real) not in (None, self.root):
            return str(real)
        return os.path.relpath(real, self.root)


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False
