"""Background jobs: long commands (test runs) started now and polled, tailed, waited on or killed."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

from sandfleet_agent.command import Command
from sandfleet_agent.errors import AgentError, not_found
from sandfleet_agent.process import ExecSpec, ProcessResult, run

DEFAULT_JOB_OUTPUT_BYTES = 16 << 20
MAX_JOBS_KEPT = 256


@dataclass
class Job:
    """One background command and everything known about it so far."""

    job_id: str
    argv: list[str]
    spec: ExecSpec
    created_at: float
    result: ProcessResult = field(default_factory=ProcessResult)
    proc: Command | None = None
    error: AgentError | None = None
    finished: threading.Event = field(default_factory=threading.Event)
    stop_requested: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def state(self) -> str:
        """Return running, exited, timed_out, killed or failed_to_start."""
        if not self.finished.is_set():
            return "running"
        if self.error is not None:
            return "failed_to_start"
        if self.result.timed_out:
            return "timed_out"
        if self.result.killed:
            return "killed"
        return "exited"

    def status(self) -> dict[str, object]:
        """The job's status as a JSON object."""
        with self.lock:
            body: dict[str, object] = {
                "job_id": self.job_id,
                "argv": self.argv,
                "state": self.state(),
                "pid": self.result.pid or None,
                "created_at": self.created_at,
            }
            body.update(self.result.summary())
            if not self.finished.is_set() and self.result.start_monotonic:
                body["duration_s"] = round(time.monotonic() - self.result.start_monotonic, 6)
            if self.error is not None:
                body["error"] = self.error.to_json()["error"]
            return body

    def read(self, stream: str, offset: int, max_bytes: int) -> tuple[bytes, int, int]:
        """Return (data, offset it starts at, bytes kept so far) for a slice of one stream."""
        with self.lock:
            buffer = self.result.stdout if stream == "stdout" else self.result.stderr
            size = len(buffer)
            start = size + offset if offset < 0 else offset
            start = min(max(start, 0), size)
            return bytes(buffer[start : start + max_bytes]), start, size


class JobTable:
    """The agent's background jobs, by id; finished ones are forgotten oldest first past a limit."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def start(self, spec: ExecSpec) -> Job:
        """Start a job in a thread of its own and return once its process exists (or failed)."""
        job = Job(
            job_id=uuid.uuid4().hex[:16],
            argv=spec.argv,
            spec=spec,
            created_at=time.time(),
        )
        started = threading.Event()

        def on_start(proc: Command) -> None:
            job.proc = proc
            job.result.pid = proc.pid
            started.set()

        def body() -> None:
            try:
                # Output is appended under the job's lock so readers see consistent slices.
                run(
                    spec,
                    on_start=on_start,
                    should_stop=lambda: job.stop_requested,
                    into=job.result,
                    lock=job.lock,
                )
            except AgentError as error:
                job.error = error
            finally:
                job.finished.set()
                started.set()

        threading.Thread(target=body, name=f"job-{job.job_id}", daemon=True).start()
        started.wait()
        if job.error is not None:
            raise job.error
        with self._lock:
            self._jobs[job.job_id] = job
            self._forget_oldest_finished()
        return job

    def get(self, job_id: str) -> Job:
        """Look a job up by id."""
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise not_found(f"no job {job_id!r}", code="job_not_found")
        return job

    def all(self) -> list[Job]:
        """Every job still remembered, oldest first."""
        with self._lock:
            return sorted(self._jobs.values(), key=lambda job: job.created_at)

    def kill(self, job_id: str, wait_s: float = 5.0) -> Job:
        """Kill every process a job started and wait (briefly) for it to be reaped."""
        job = self.get(job_id)
        if not job.finished.is_set():
            job.stop_requested = True
            if job.proc is not None:
                with job.lock:
                    job.result.killed = True
                job.proc.kill()
            job.finished.wait(wait_s)
        return job

    def remove(self, job_id: str) -> None:
        """Kill a job if it runs and forget it."""
        self.kill(job_id)
        with self._lock:
            self._jobs.pop(job_id, None)

    def forget_all(self) -> None:
        """Forget every job (after a reset, the next episode starts with none)."""
        with self._lock:
            self._jobs.clear()

    def kill_all(self) -> None:
        """Kill every running job (the agent is shutting down)."""
        for job in self.all():
            if not job.finished.is_set():
                self.kill(job.job_id, wait_s=1.0)

    def _forget_oldest_finished(self) -> None:
        finished = [job for job in self._jobs.values() if job.finished.is_set()]
        finished.sort(key=lambda job: job.created_at)
        for job in finished[: max(len(self._jobs) - MAX_JOBS_KEPT, 0)]:
            del self._jobs[job.job_id]
