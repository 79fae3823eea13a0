"""File operations inside the working area: read, write, list, stat, delete, tar in and out."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import tarfile
from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path
from typing import BinaryIO, Literal

from sandfleet_agent.errors import AgentError, not_found, unprocessable
from sandfleet_agent.paths import Workspace
from sandfleet_agent.streams import ByteSink, ByteSource, StreamFile

COPY_CHUNK = 256 << 10
# New files are created relative to a directory descriptor, never through a link at their name.
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LIST_ENTRIES = 100_000


def describe(workspace: Workspace, path: Path, info: os.stat_result | None = None) -> dict[str, object]:
    """One directory entry as JSON: path relative to the root, type, size, mode and mtime."""
    info = info if info is not None else os.lstat(path)
    if stat.S_ISDIR(info.st_mode):
        kind = "directory"
    elif stat.S_ISLNK(info.st_mode):
        kind = "symlink"
    elif stat.S_ISREG(info.st_mode):
        kind = "file"
    else:
        kind = "other"
    entry: dict[str, object] = {
        "name": path.name,
        "path": workspace.relative(path),
        # Where it is in the sandbox (E2B names files so; the working area is the image's WorkingDir).
        "absolute": str(path),
        "type": kind,
        "size": info.st_size,
        "mode": f"{stat.S_IMODE(info.st_mode):04o}",
        "mtime": info.st_mtime,
    }
    if kind == "symlink":
        entry["target"] = os.readlink(path)
    return entry


def stat_path(workspace: Workspace, raw: str) -> dict[str, object]:
    """Describe one path."""
    path = workspace.resolve(raw)
    try:
        return describe(workspace, path)
    except FileNotFoundError:
        raise not_found(f"no such file or directory: {raw!r}", code="file_not_found") from None


def open_for_read(workspace: Workspace, raw: str) -> tuple[BinaryIO, int]:
    """Open a regular file for streaming out; returns the file and its size."""
    path = workspace.resolve(raw)
    if workspace.is_base(path):
        raise unprocessable(f"{raw!r} is a directory", "is_a_directory")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        parent = workspace.open_dir(path.parent)
        try:
            # Not through a link swapped in since resolving, and never blocking on a fifo.
            descriptor = os.open(path.name, flags, dir_fd=parent)
        finally:
            os.close(parent)
    except FileNotFoundError:
        raise not_found(f"no such file: {raw!r}", code="file_not_found") from None
    except PermissionError:
        raise AgentError(HTTPStatus.FORBIDDEN, "permission_denied", f"cannot read {raw!r}") from None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise AgentError(
                HTTPStatus.CONFLICT, "path_changed", f"{raw!r} became a link while the agent used it; retry"
            ) from None
        raise
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode):
        os.close(descriptor)
        if stat.S_ISDIR(info.st_mode):
            raise unprocessable(f"{raw!r} is a directory", "is_a_directory")
        raise unprocessable(f"{raw!r} is not a regular file", "not_a_file")
    os.set_blocking(descriptor, True)
    return os.fdopen(descriptor, "rb"), info.st_size


def write_file(
    workspace: Workspace, raw: str, source: ByteSource, length: int | None, mode: int | None
) -> dict[str, object]:
    """Write a file atomically (temp file then rename), creating parent directories."""
    path = workspace.resolve(raw)
    if workspace.is_base(path) or path.is_dir():
        raise unprocessable(f"{raw!r} is a directory", "is_a_directory")
    parent = _make_parents(workspace, path, raw)
    temp_name = f".{path.name}.{secrets.token_hex(6)}.part"
    try:
        descriptor = os.open(temp_name, _CREATE | os.O_EXCL, 0o600, dir_fd=parent)
        try:
            with os.fdopen(descriptor, "wb") as out:
                written = copy_stream(source, out, length)
                # Owner before mode: a set-id bit is the commands' user's, never the agent's.
                owner = workspace.owner_for(path)
                if owner is not None:
                    os.fchown(out.fileno(), *owner)
                wanted = mode if mode is not None else 0o644
                # Outside the working area the file stays root's: never a set-id root binary.
                os.fchmod(out.fileno(), wanted if workspace.in_working_area(path) else wanted & 0o777)
            os.replace(temp_name, path.name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp_name, dir_fd=parent)
            raise
    finally:
        os.close(parent)
    return {"path": workspace.relative(path), "size": written}


def copy_stream(source: ByteSource, out: ByteSink, length: int | None) -> int:
    """Copy `length` bytes (or until EOF when None), failing clearly on a short body."""
    written = 0
    while length is None or written < length:
        want = COPY_CHUNK if length is None else min(COPY_CHUNK, length - written)
        chunk = source.read(want)
        if not chunk:
            if length is not None:
                raise bad_body(f"request body ended after {written} of {length} bytes")
            break
        out.write(chunk)
        written += len(chunk)
    return written


def bad_body(message: str) -> AgentError:
    """Build the error for a request body that does not match what it announced."""
    return AgentError(HTTPStatus.BAD_REQUEST, "bad_body", message)


def list_dir(workspace: Workspace, raw: str, recursive: bool) -> dict[str, object]:
    """List a directory (optionally its whole tree), never following symlinks out of it."""
    path = workspace.resolve(raw)
    if not path.exists():
        raise not_found(f"no such directory: {raw!r}", code="file_not_found")
    if not path.is_dir():
        raise unprocessable(f"{raw!r} is not a directory", "not_a_directory")
    entries: list[dict[str, object]] = []
    truncated = False
    for entry_path in _walk(path, recursive):
        if len(entries) >= MAX_LIST_ENTRIES:
            truncated = True
            break
        try:
            entries.append(describe(workspace, entry_path))
        except FileNotFoundError:
            continue
    return {
        "path": workspace.relative(path),
        "absolute": str(path),
        "entries": entries,
        "truncated": truncated,
    }


def _walk(path: Path, recursive: bool) -> Iterator[Path]:
    with os.scandir(path) as scan:
        children = sorted(scan, key=lambda entry: entry.name)
    for child in children:
        yield Path(child.path)
        if recursive and child.is_dir(follow_symlinks=False):
            yield from _walk(Path(child.path), recursive)


def delete(workspace: Workspace, raw: str, recursive: bool) -> dict[str, object]:
    """Delete a file, a symlink, or (with recursive) a directory tree; never the root itself."""
    link = _link_path(workspace, raw)
    path = link if link.is_symlink() else workspace.resolve(raw)
    if workspace.is_base(path):
        raise unprocessable("refusing to delete the working area itself", "cannot_delete_root")
    if not os.path.lexists(path):
        raise not_found(f"no such file or directory: {raw!r}", code="file_not_found")
    parent = workspace.open_dir(path.parent)
    try:
        if stat.S_ISDIR(os.lstat(path.name, dir_fd=parent).st_mode):
            if not recursive:
                try:
                    os.rmdir(path.name, dir_fd=parent)
                except OSError:
                    raise unprocessable(
                        f"{raw!r} is a non-empty directory; pass recursive=1", "directory_not_empty"
                    ) from None
            else:
                shutil.rmtree(path.name, dir_fd=parent)
        else:
            os.unlink(path.name, dir_fd=parent)
    finally:
        os.close(parent)
    return {"path": workspace.relative(path), "deleted": True}


def _link_path(workspace: Workspace, raw: str) -> Path:
    """The path itself with only its parent resolved: deleting a link removes the link."""
    candidate = Path(os.path.normpath(raw if os.path.isabs(raw) else workspace.root / raw))
    if candidate == workspace.root:
        return workspace.root
    parent = workspace.resolve(str(candidate.parent))
    return parent / candidate.name


def write_archive(workspace: Workspace, raw: str, out: StreamFile, gzip: bool) -> None:
    """Stream a tar (optionally gzipped) of a directory tree or single file to `out`."""
    path = workspace.resolve(raw)
    if not path.exists():
        raise not_found(f"no such file or directory: {raw!r}", code="file_not_found")
    mode: Literal["w|gz", "w|"] = "w|gz" if gzip else "w|"
    with tarfile.open(fileobj=out, mode=mode, format=tarfile.PAX_FORMAT) as tar:
        if path.is_dir():
            for child in sorted(path.iterdir()):
                tar.add(child, arcname=child.name, recursive=True)
        else:
            tar.add(path, arcname=path.name)


def extract_archive(workspace: Workspace, raw: str, source: StreamFile) -> dict[str, object]:
    """Unpack a tar stream (plain, gzip, bzip2 or xz) into a directory, refusing unsafe members.

    Refused: absolute names, `..`, anything resolving outside the working area (including through
    symlinks already there or in the archive), hard links, and device or fifo nodes. A link may
    start resolving outside only once a later member changes a path it goes through
    (`esc -> a/../..`, then `a -> .`), so every link this archive made is checked again after each
    new one; on refusal the links that escape are removed, and nothing was written through them.
    """
    dest = workspace.resolve(raw)
    os.close(_make_parents(workspace, dest / "x", raw))
    files = 0
    total = 0
    links: list[tuple[Path, str]] = []
    try:
        with tarfile.open(fileobj=source, mode="r|*") as tar:
            for member in tar:
                target = _member_target(workspace, dest, member)
                if target == dest and member.isdir():
                    continue  # `./`, as `tar -C dir -czf - .` writes first: the destination itself
                if member.isdir():
                    directory = workspace.open_dir(target, create=True)
                    try:
                        os.fchmod(directory, (member.mode & 0o777) | 0o700)
                    finally:
                        os.close(directory)
                elif member.issym():
                    _check_link(workspace, target, member.linkname, member.name)
                    _make_link(workspace, target, member.linkname)
                    links.append((target, member.name))
                    for link, name in links:
                        _check_link(workspace, link, os.readlink(link), name)
                elif member.isreg():
                    content = tar.extractfile(member)
                    assert content is not None
                    total += _write_member(workspace, target, content, member)
                    files += 1
                else:
                    raise unsafe_archive(f"member {member.name!r} is not a file, directory or symlink")
    except tarfile.TarError as error:
        raise unprocessable(f"not a readable tar archive: {error}", "bad_archive") from None
    except AgentError:
        _remove_escaping(workspace, links)
        raise
    return {"path": workspace.relative(dest), "files": files, "bytes": total}


def _write_member(workspace: Workspace, target: Path, content: ByteSource, member: tarfile.TarInfo) -> int:
    """Write one regular member; an existing link at its name is replaced, never followed."""
    parent = workspace.open_dir(target.parent, create=True)
    try:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISLNK(os.lstat(target.name, dir_fd=parent).st_mode):
                os.unlink(target.name, dir_fd=parent)
        descriptor = os.open(target.name, _CREATE | os.O_TRUNC, 0o600, dir_fd=parent)
        with os.fdopen(descriptor, "wb") as out:
            written = copy_stream(content, out, member.size)
            owner = workspace.owner_for(target)
            if owner is not None:
                os.fchown(out.fileno(), *owner)
            os.fchmod(out.fileno(), member.mode & 0o777)
    finally:
        os.close(parent)
    return written


def _make_link(workspace: Workspace, target: Path, linkname: str) -> None:
    parent = workspace.open_dir(target.parent, create=True)
    try:
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISDIR(os.lstat(target.name, dir_fd=parent).st_mode):
                os.unlink(target.name, dir_fd=parent)
        os.symlink(linkname, target.name, dir_fd=parent)
        owner = workspace.owner_for(target)
        if owner is not None:
            os.chown(target.name, *owner, dir_fd=parent, follow_symlinks=False)
    finally:
        os.close(parent)


def _remove_escaping(workspace: Workspace, links: list[tuple[Path, str]]) -> None:
    for link, _ in links:
        with contextlib.suppress(OSError, AgentError):
            if os.path.islink(link) and not _inside(workspace, Path(os.path.realpath(link))):
                parent = workspace.open_dir(link.parent)
                try:
                    os.unlink(link.name, dir_fd=parent)
                finally:
                    os.close(parent)


def unsafe_archive(message: str) -> AgentError:
    """Build the error for an archive member that would escape or is not allowed."""
    return unprocessable(message, "unsafe_archive")


def _member_target(workspace: Workspace, dest: Path, member: tarfile.TarInfo) -> Path:
    name = member.name
    parts = Path(name).parts
    if os.path.isabs(name) or ".." in parts or "\x00" in name:
        raise unsafe_archive(f"member {name!r} has an absolute path or '..'")
    if os.path.normpath(name) == ".":
        if not member.isdir():
            raise unsafe_archive(f"member {name!r} names the destination itself but is not a directory")
        return dest
    try:
        parent = workspace.resolve(str(dest / name) + "/..")
    except AgentError:
        raise unsafe_archive(f"member {name!r} would land outside the working area") from None
    target = parent / Path(name).name if Path(name).name else parent
    if not workspace.contains(target):
        raise unsafe_archive(f"member {name!r} would land outside the working area")
    return target


def _inside(workspace: Workspace, real: Path) -> bool:
    return workspace.contains(real)


def _check_link(workspace: Workspace, target: Path, linkname: str, name: str) -> None:
    pointed = os.path.join(target.parent, linkname)
    if not _inside(workspace, Path(os.path.realpath(pointed))):
        raise unsafe_archive(f"symlink {name!r} -> {linkname!r} resolves outside the working area")


def _make_parents(workspace: Workspace, path: Path, raw: str) -> int:
    """Create the missing parents of `path` (owned by the commands' user); a descriptor of the parent."""
    try:
        return workspace.open_dir(path.parent, create=True)
    except (FileExistsError, NotADirectoryError):
        raise unprocessable(f"a parent of {raw!r} is not a directory", "not_a_directory") from None
