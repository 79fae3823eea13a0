"""What a reset probe reads inside the sandbox: its processes, its sockets, digests of writable roots.

The runtime compares the answer of a freshly reset sandbox with that of the golden sandbox it was
reset from (sandfleet.core.recycle.probe_problems): everything here is read, nothing is judged.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

PROC = Path("/proc")
# Files up to this size are hashed by content; larger ones by size and modification time only.
HASH_LIMIT = 1 << 20
SOCKET_TABLES = ("tcp", "tcp6", "udp", "udp6")


def processes() -> list[dict[str, object]]:
    """Every process: pid, real uid and command line (threads are not processes)."""
    found: list[dict[str, object]] = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").strip().decode(errors="replace")
            uid = _status_uid((entry / "status").read_text())
        except OSError:
            continue  # it exited while we looked
        found.append({"pid": int(entry.name), "uid": uid, "cmdline": cmdline})
    return sorted(found, key=lambda p: int(str(p["pid"])))


def _status_uid(status: str) -> int:
    for line in status.splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return -1


def sockets() -> list[dict[str, object]]:
    """Every inet socket (/proc/net/tcp, tcp6, udp, udp6) and every unix socket, by port or path."""
    found: list[dict[str, object]] = []
    for table in SOCKET_TABLES:
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4:
                continue
            local, remote, state = fields[1], fields[2], fields[3]
            found.append(
                {
                    "proto": table,
                    "local_port": int(local.rsplit(":", 1)[1], 16),
                    "remote_port": int(remote.rsplit(":", 1)[1], 16),
                    "state": state.upper() if table.startswith("tcp") else "",
                }
            )
    try:
        unix = (PROC / "net" / "unix").read_text().splitlines()[1:]
    except OSError:
        unix = []
    for line in unix:
        fields = line.split()
        path = fields[7] if len(fields) > 7 else "(unnamed)"
        found.append({"proto": f"unix:{path}", "local_port": 0, "remote_port": 0, "state": ""})
    return found


def tree_digest(root: Path) -> str:
    """A digest of everything under `root` (names, types, owners, modes, sizes, times, contents).

    "absent" if it does not exist. Symbolic links are recorded, never followed.
    """
    try:
        top = os.lstat(root)
    except FileNotFoundError:
        return "absent"
    digest = hashlib.sha256()
    _entry(digest, ".", top, root)
    if stat.S_ISDIR(top.st_mode):
        for directory, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(dirs + files):
                path = Path(directory) / name
                try:
                    _entry(digest, str(path.relative_to(root)), os.lstat(path), path)
                except OSError as error:
                    digest.update(f"{path}: {error.strerror}\n".encode())
    return digest.hexdigest()


def _entry(digest: hashlib._Hash, name: str, info: os.stat_result, path: Path) -> None:
    # A directory's own time and size change when a file comes and goes again (a command's
    # temporary file) or the directory is copied up into the overlay: what it holds is recorded
    # entry by entry instead.
    directory = stat.S_ISDIR(info.st_mode)
    size, mtime = (0, 0) if directory else (info.st_size, info.st_mtime_ns)
    line = f"{name}\0{info.st_mode:o}\0{info.st_uid}\0{info.st_gid}\0{size}\0{mtime}"
    digest.update(line.encode(errors="surrogateescape"))
    if stat.S_ISLNK(info.st_mode):
        digest.update(os.readlink(path).encode(errors="surrogateescape"))
    elif stat.S_ISREG(info.st_mode) and info.st_size <= HASH_LIMIT:
        with open(path, "rb") as handle:
            digest.update(hashlib.sha256(handle.read()).digest())
    digest.update(b"\n")


def fingerprint(roots: list[str]) -> dict[str, object]:
    """The probe's answer: processes, sockets, and each of `roots`' digest."""
    return {
        "processes": processes(),
        "sockets": sockets(),
        "files": {root: tree_digest(Path(root)) for root in roots},
    }
