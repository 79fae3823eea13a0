"""Starting, finding and stopping the cluster's daemons, each in its own process group with a pidfile."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Daemon:
    """One long-running component of the cluster."""

    name: str
    argv: tuple[str, ...]
    state_dir: Path

    @property
    def pidfile(self) -> Path:
        return self.state_dir / "run" / f"{self.name}.pid"

    @property
    def logfile(self) -> Path:
        return self.state_dir / "logs" / f"{self.name}.log"

    def start(self, env: dict[str, str] | None = None) -> int:
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        with self.logfile.open("ab") as log:
            proc = subprocess.Popen(
                self.argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, so stop() reaches any children
                cwd=self.state_dir,
            )
        self.pidfile.write_text(str(proc.pid))
        return proc.pid

    def pid(self) -> int | None:
        """The daemon's pid if it is alive and still the binary we started (pids get reused)."""
        try:
            pid = int(self.pidfile.read_text())
            exe = os.readlink(f"/proc/{pid}/exe")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
            return None
        if state == "Z" or Path(exe.removesuffix(" (deleted)")).name != Path(self.argv[0]).name:
            return None
        return pid

    def stop(self, timeout: float = 15.0) -> None:
        pid = self.pid()
        if pid is not None:
            _signal_group(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.1)
            if _alive(pid):
                _signal_group(pid, signal.SIGKILL)
                while _alive(pid):
                    time.sleep(0.05)
        self.pidfile.unlink(missing_ok=True)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # ESRCH when it exits between the open and the read
        return False
    if state == "Z":
        # Our own child that exited: reap it so it does not linger as a zombie.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True
