"""A reset from inside the sandbox (for runtimes without checkpoint and restore, e.g. a kubelet).

When enabled (`--pristine-dir`), the agent copies its writable roots, before it serves anything,
into a directory only root can read; a reset ends every process of the sandbox's users, empties
those roots and copies the pristine state back (contents, owners, modes, times). The runtime then
proves the result with the same probe it compares with a fresh sandbox's (`probe.fingerprint`).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path


def capture(roots: tuple[Path, ...], pristine: Path) -> None:
    """Copy each existing root into `pristine`/<its index>, which only root may enter."""
    pristine.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(pristine, 0o700)
    for index, root in enumerate(roots):
        if root.is_dir() and not root.is_symlink():
            _clone(root, pristine / str(index))


def restore(roots: tuple[Path, ...], pristine: Path) -> None:
    """Make each captured root what it was at capture: everything in it removed, the copy put back.

    Nothing under a root is followed: links are removed as links, and only the pristine copy (made
    before any command ran) is ever read.
    """
    for index, root in enumerate(roots):
        saved = pristine / str(index)
        if not saved.is_dir():
            continue
        _empty(root)
        _clone(saved, root)


def _empty(root: Path) -> None:
    # The root itself may be a mount point (a tmpfs, an emptyDir): keep it, remove what it holds.
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)


def _clone(source: Path, target: Path) -> None:
    shutil.copytree(source, target, symlinks=True, copy_function=shutil.copy2, dirs_exist_ok=True)
    # copytree keeps modes and times but not owners; directories last, so their times hold.
    for directory, dirs, files in os.walk(source, topdown=False):
        relative = Path(directory).relative_to(source)
        for name in (*files, *dirs):
            _own_like(Path(directory) / name, target / relative / name)
        _own_like(Path(directory), target / relative)


def _own_like(source: Path, target: Path) -> None:
    info = os.lstat(source)
    os.lchown(target, info.st_uid, info.st_gid)
    if not stat.S_ISLNK(info.st_mode):
        os.chmod(target, stat.S_IMODE(info.st_mode))  # chown drops setuid and setgid bits
        os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
