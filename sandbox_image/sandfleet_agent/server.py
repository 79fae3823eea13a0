"""The agent's HTTP/1.1 server: versioned JSON routes over exec, jobs, files and evaluate."""

from __future__ import annotations

import hmac
import json
import os
import re
import select
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from sandfleet_agent import files, jobs, probe, process, programs, reset, users
from sandfleet_agent.errors import AgentError, bad_request, not_found
from sandfleet_agent.evaluate import Verification, evaluate
from sandfleet_agent.params import JsonObject, query_flag, query_int, required_query
from sandfleet_agent.paths import Workspace
from sandfleet_agent.streams import ChunkedReader, ChunkedWriter, LimitedReader
from sandfleet_agent.users import Identity

AGENT_VERSION = "0.1.0"
MAX_JSON_BODY = 64 << 20
MAX_READ_CHUNK = 16 << 20
MAX_DRAIN_ON_ERROR = 8 << 20
DEFAULT_READY_TIMEOUT_S = 10.0
# A new bearer token (POST /v1/rekey) is at least this long: a typo must not weaken an agent.
MIN_TOKEN_CHARS = 32
MAX_PROBE_ROOTS = 64
# Routes a kubelet or the local runtime probes without credentials.
UNAUTHENTICATED = {"/v1/health", "/v1/ready"}
# The header that says which episode of the sandbox a call belongs to (the gateway sends it).
EPISODE_HEADER = "X-Sandfleet-Episode"
# Routes only the runtime calls, between episodes: no episode fences them.
UNFENCED = UNAUTHENTICATED | {"/v1/reset", "/v1/rekey", "/v1/probe"}


@dataclass
class AgentConfig:
    """Everything the server needs to know about the sandbox it runs in."""

    root: Path
    logs_dir: Path
    token: str | None = None
    verbose: bool = False
    # Who commands and the verifier run as; None runs them as the agent itself (tests on a host).
    exec_user: Identity | None = None
    verifier_user: Identity | None = None
    # Absolute directories besides the root that files routes reach (Harbor's /tests, /logs, /solution).
    extra_roots: tuple[Path, ...] = ()
    # Where the writable roots were copied at start (POST /v1/reset puts them back); None: no reset.
    pristine: Path | None = None
    # The image's own environment (its config's Env), for an agent injected into an image it was
    # not built into: every command starts from it. None: the short allow-list of the agent's own.
    image_env: dict[str, str] | None = None
    reset_roots: tuple[Path, ...] = ()
    # The sandbox's episode: 0 until the first reset, which moves it on. A call of an earlier
    # episode (one its gateway forwarded late) is refused, so it never reaches the next episode.
    episode: int = 0
    # The agent's own probe of the sandbox before anything ran in it: what a reset must restore.
    golden: dict[str, object] | None = None


class AgentServer(ThreadingHTTPServer):
    """A threading HTTP server that carries the agent's state."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], config: AgentConfig) -> None:
        super().__init__(address, AgentHandler)
        self.config = config
        owner = None if config.exec_user is None else (config.exec_user.uid, config.exec_user.gid)
        self.workspace = Workspace(config.root, owner=owner, extra_roots=config.extra_roots)
        self.jobs = jobs.JobTable()
        self.reset_lock = threading.Lock()
        # Whether a caller's command (exec, a job) ever ran here: a sandbox whose commands run as root
        # scores only while none has (evaluate.py), i.e. as the clean sandbox of another's episode.
        self.commands_ran = False
        self.started_at = time.monotonic()
        self.base_env = (
            base_environment(config.root, config.exec_user)
            if config.image_env is None
            else image_environment(config.image_env, config.exec_user)
        )


DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def image_environment(image_env: Mapping[str, str], user: Identity | None) -> dict[str, str]:
    """The environment of an image's commands: its config's Env, as a container runtime gives it.

    PATH defaults to the container runtimes' default; HOME is the commands' user's (sandfleet picks
    that user, not the image), or the image's (else /root) when commands run as the agent. Nothing
    of the agent's own environment (its token, its bundle) is in it.
    """
    env = dict(image_env)
    env.setdefault("PATH", DEFAULT_PATH)
    if user is not None:
        env["HOME"] = user.home
    else:
        env.setdefault("HOME", "/root")
    return env


def base_environment(root: Path, user: Identity | None = None) -> dict[str, str]:
    """The environment every command starts from; a request's `env` is laid over it.

    Built from a short allow-list, never copied whole: the agent's own environment holds its
    bearer token, which the code it runs must not see.
    """
    env = {
        "PATH": os.environ.get("PATH", DEFAULT_PATH),
        "HOME": user.home if user is not None else os.environ.get("HOME", str(root)),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    for name in ("TERM", "TMPDIR") if user is not None else ("USER", "TERM", "TMPDIR"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


Route = Callable[["AgentHandler", re.Match[str]], None]


class AgentHandler(BaseHTTPRequestHandler):
    """One HTTP connection (keep-alive): routes requests and turns errors into JSON."""

    protocol_version = "HTTP/1.1"
    server: AgentServer
    server_version = f"sandfleet-agent/{AGENT_VERSION}"

    def setup(self) -> None:
        """Disable Nagle: small responses would otherwise wait on the client's delayed ACK."""
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        """Dispatch a GET."""
        self._dispatch("GET")

    def do_POST(self) -> None:
        """Dispatch a POST."""
        self._dispatch("POST")

    def do_PUT(self) -> None:
        """Dispatch a PUT."""
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        """Dispatch a DELETE."""
        self._dispatch("DELETE")

    def log_message(self, format: str, *args: object) -> None:
        """Log requests only when asked: access logs cost time on the exec path."""
        if self.server.config.verbose:
            sys.stderr.write(f"agent: {self.address_string()} {format % args}\n")

    # --- dispatch -----------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        self._headers_sent = False
        self._body_left = self._announced_length()
        split = urlsplit(self.path)
        self.query = dict(parse_qsl(split.query, keep_blank_values=True))
        try:
            route, match = _find_route(method, split.path)
            if split.path not in UNAUTHENTICATED:
                self._check_token()
            if split.path not in UNFENCED:
                self._check_episode()
            route(self, match)
        except AgentError as error:
            self._fail(error)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except PermissionError as error:
            self._fail(AgentError(HTTPStatus.FORBIDDEN, "permission_denied", _os_message(error)))
        except OSError as error:
            # Disk full, read-only file system and the like: the request was fine, the sandbox said no.
            self._fail(AgentError(HTTPStatus.UNPROCESSABLE_ENTITY, "os_error", _os_message(error)))
        except Exception:
            traceback.print_exc(file=sys.stderr)
            self._fail(
                AgentError(
                    HTTPStatus.INTERNAL_SERVER_ERROR, "internal_error", "the agent failed; see its log"
                )
            )
        if self._body_left != 0:
            # An unread body would be parsed as the next request: drop the connection instead.
            self.close_connection = True

    def _fail(self, error: AgentError) -> None:
        if self._headers_sent:
            self.close_connection = True
            return
        # Closing with unread request bytes makes the kernel send a reset, which can destroy the
        # error response before the client reads it: read a modest remainder first.
        if 0 < self._body_left <= MAX_DRAIN_ON_ERROR:
            self._body().read()
        self._send_json(error.status, error.to_json())

    def _check_token(self) -> None:
        token = self.server.config.token
        if token is None:
            return
        given = self.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise AgentError(HTTPStatus.UNAUTHORIZED, "unauthorized", "missing or wrong bearer token")

    def _check_episode(self) -> None:
        given = self.headers.get(EPISODE_HEADER, "0")
        current = self.server.config.episode
        if given != str(current):
            raise AgentError(
                HTTPStatus.GONE,
                "episode_ended",
                f"this call belongs to episode {given!r} of the sandbox, which is now in episode "
                f"{current}: the lease it was made under has ended",
            )

    # --- request bodies -----------------------------------------------------------------------

    def _announced_length(self) -> int:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return -1
        raw = self.headers.get("Content-Length")
        if raw is None:
            return 0
        try:
            return max(int(raw), 0)
        except ValueError:
            return 0

    def _note_body_left(self, left: int) -> None:
        self._body_left = left

    def _body(self) -> LimitedReader | ChunkedReader:
        """The request body as a stream, whether sent with Content-Length or chunked."""
        if self._body_left == -1:
            self._body_left = 0
            return ChunkedReader(self.rfile)
        return LimitedReader(self.rfile, self._body_left, self._note_body_left)

    def _json_body(self) -> JsonObject:
        if self._body_left > MAX_JSON_BODY:
            raise AgentError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                "body_too_large",
                f"JSON bodies are capped at {MAX_JSON_BODY} bytes",
            )
        raw = self._body().read()
        if not raw:
            return {}
        try:
            body = json.loads(raw)
        except ValueError:
            raise bad_request("the request body is not valid JSON", code="bad_json") from None
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object", code="bad_json")
        return body

    # --- responses ----------------------------------------------------------------------------

    def _send_json(self, status: HTTPStatus, body: object) -> None:
        payload = json.dumps(body, separators=(",", ":")).encode()
        self._send_bytes(status, "application/json", payload)

    def _send_bytes(self, status: HTTPStatus, content_type: str, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self._headers_sent = True
        self.wfile.write(payload)

    def _start_chunked(self, content_type: str) -> ChunkedWriter:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._headers_sent = True
        return ChunkedWriter(self.wfile)

    # --- routes -------------------------------------------------------------------------------

    def health(self, _: re.Match[str]) -> None:
        """Liveness: the process serves HTTP (unauthenticated, so it says nothing about the sandbox)."""
        self._send_json(HTTPStatus.OK, {"status": "ok", "version": AGENT_VERSION})

    def ready(self, _: re.Match[str]) -> None:
        """Readiness: a real command went through the exec path and exited 0."""
        spec = process.ExecSpec(
            argv=programs.ready_check(),
            cwd=self.server.workspace.root,
            env=programs.own_program_env(self.server.base_env),
            stdin=b"",
            timeout_s=DEFAULT_READY_TIMEOUT_S,
            max_output_bytes=4096,
            encoding="utf-8",
            user=self.server.config.exec_user,
        )
        # Never during a reset: its probe would see the check's own process and fail the reset.
        with self.server.reset_lock:
            result = process.run(spec)
        ok = result.exit_code == 0
        self._send_json(
            HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE,
            {"ready": ok, "exec_s": round(result.duration_s, 6), "exit_code": result.exit_code},
        )

    def rekey(self, _: re.Match[str]) -> None:
        """Replace the bearer token (authenticated with the current one, which stops working).

        A sandbox restored from a golden checkpoint wakes with the golden agent's token; the runtime
        gives each restored sandbox its own before anyone else can reach it. The gateway never
        forwards this route, so only the token's holders (the runtime) can call it.
        """
        token = self._json_body().get("token")
        if not isinstance(token, str) or len(token) < MIN_TOKEN_CHARS or not token.isascii():
            raise bad_request(f"token must be an ASCII string of at least {MIN_TOKEN_CHARS} characters")
        if any(c.isspace() for c in token):
            raise bad_request("token must not contain whitespace")
        if self.server.config.token is None:
            raise AgentError(HTTPStatus.CONFLICT, "no_token", "this agent serves without a token")
        self.server.config.token = token
        self._send_json(HTTPStatus.OK, {"rekeyed": True})

    def reset(self, _: re.Match[str]) -> None:
        """End every process of the sandbox's users and put the writable roots back as they were.

        For runtimes that cannot restore a checkpoint (a Pod): the runtime probes the result and
        rekeys the agent before the sandbox serves another episode.
        """
        with self.server.reset_lock:  # two resets at once must not both move the episode
            self._reset()

    def _reset(self) -> None:
        config = self.server.config
        who = [user for user in (config.exec_user, config.verifier_user) if user is not None]
        if config.pristine is None or not who:
            raise AgentError(
                HTTPStatus.CONFLICT,
                "reset_not_enabled",
                "this agent resets only when started with --pristine-dir and --exec-user "
                "(commands run as the agent itself cannot be told apart from it)",
            )
        episode = self._json_body().get("episode", config.episode + 1)
        if not isinstance(episode, int) or isinstance(episode, bool):
            raise bad_request("episode must be an integer: the episode the reset sandbox serves next")
        if episode <= config.episode:
            # Another runtime call reset it already (two gateways releasing the same lease).
            raise AgentError(
                HTTPStatus.CONFLICT,
                "episode_already_reset",
                f"the sandbox is in episode {config.episode} already; a reset moves it past that",
            )
        # The fence moves first: from here on, no call of the ended episode gets in.
        config.episode = episode
        started = time.monotonic()
        self.server.jobs.kill_all()
        self.server.jobs.forget_all()
        survivors = [pid for user in who for pid in users.end_all_processes_of(user)]
        if survivors:
            raise AgentError(
                HTTPStatus.SERVICE_UNAVAILABLE, "reset_failed", f"processes {survivors} survived the reset"
            )
        ended = time.monotonic()
        reset.restore(config.reset_roots, config.pristine)
        done = time.monotonic()
        timings = {"kill_s": round(ended - started, 6), "restore_s": round(done - ended, 6)}
        # The probe the runtime compares with the golden one, in the same round trip.
        seen = probe.fingerprint([str(root) for root in config.reset_roots])
        self._send_json(
            HTTPStatus.OK,
            {"reset": True, "episode": episode, **timings, "probe": seen, "golden": config.golden},
        )

    def probe(self, _: re.Match[str]) -> None:
        """What a reset probe compares with the golden sandbox's: processes, sockets, writable roots."""
        roots = self._json_body().get("roots", [])
        if (
            not isinstance(roots, list)
            or len(roots) > MAX_PROBE_ROOTS
            or not all(isinstance(r, str) and r.startswith("/") for r in roots)
        ):
            raise bad_request(f"roots must be a list of at most {MAX_PROBE_ROOTS} absolute paths")
        self._send_json(HTTPStatus.OK, probe.fingerprint(roots))

    def exec(self, _: re.Match[str]) -> None:
        """Run a command to completion and return its captured output."""
        spec = self._exec_spec(self._json_body())
        result = process.run(spec)
        self._send_json(HTTPStatus.OK, _exec_response(result, spec.encoding))

    def exec_stream(self, _: re.Match[str]) -> None:
        """Run a command and stream its output as NDJSON events while it runs."""
        spec = self._exec_spec(self._json_body())
        decoders = {name: process.TextDecoder(spec.encoding) for name in ("stdout", "stderr")}
        writer: list[ChunkedWriter] = []

        def on_start(proc: object) -> None:
            writer.append(self._start_chunked("application/x-ndjson"))
            writer[0].event({"event": "start", "pid": getattr(proc, "pid", None)})

        def sink(stream: str, chunk: bytes) -> None:
            text = decoders[stream].decode(chunk)
            if text:
                writer[0].event({"event": stream, "data": text})

        # Past the output cap nothing is written, so a failed write can no longer tell us the client
        # left: look at the connection itself, or an abandoned command runs until its timeout.
        last_look = [0.0]

        def client_gone() -> bool:
            now = time.monotonic()
            if now - last_look[0] < 0.25:  # a syscall per output chunk would slow the flood we serve
                return False
            last_look[0] = now
            return self._client_gone()

        result = process.run(spec, sink, on_start=on_start, should_stop=client_gone)
        if result.killed and not result.timed_out and self._client_gone():
            return
        for stream, decoder in decoders.items():
            tail = decoder.decode(b"", final=True)
            if tail:
                writer[0].event({"event": stream, "data": tail})
        writer[0].event({"event": "exit", **result.summary()})
        writer[0].close()

    def _client_gone(self) -> bool:
        """Whether the caller closed its connection (checked without consuming anything it sent)."""
        connection = self.connection
        try:
            readable, _, _ = select.select([connection], [], [], 0)
            return bool(readable) and connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def job_start(self, _: re.Match[str]) -> None:
        """Start a background job."""
        spec = self._exec_spec(
            self._json_body(), default_timeout_s=None, default_output=jobs.DEFAULT_JOB_OUTPUT_BYTES
        )
        job = self.server.jobs.start(spec)
        self._send_json(HTTPStatus.CREATED, job.status())

    def job_list(self, _: re.Match[str]) -> None:
        """List the jobs the agent remembers."""
        self._send_json(HTTPStatus.OK, {"jobs": [job.status() for job in self.server.jobs.all()]})

    def job_status(self, match: re.Match[str]) -> None:
        """One job's status."""
        self._send_json(HTTPStatus.OK, self.server.jobs.get(match["job"]).status())

    def job_wait(self, match: re.Match[str]) -> None:
        """Wait (up to timeout_s) for a job to finish, then return its status."""
        job = self.server.jobs.get(match["job"])
        timeout = query_int(self.query, "timeout_s", default=30, minimum=0, maximum=3600)
        job.finished.wait(timeout)
        self._send_json(HTTPStatus.OK, job.status())

    def job_output(self, match: re.Match[str]) -> None:
        """A slice of a job's output: from `offset`, or the last `tail` bytes."""
        job = self.server.jobs.get(match["job"])
        stream = self.query.get("stream", "stdout")
        if stream not in {"stdout", "stderr"}:
            raise bad_request("'stream' must be stdout or stderr")
        max_bytes = query_int(self.query, "max_bytes", default=1 << 20, minimum=0, maximum=MAX_READ_CHUNK)
        tail = query_int(self.query, "tail", default=-1, minimum=-1, maximum=MAX_READ_CHUNK)
        offset = (
            -tail if tail >= 0 else query_int(self.query, "offset", default=0, minimum=0, maximum=1 << 40)
        )
        encoding = self.query.get("encoding", "utf-8")
        if encoding not in {"utf-8", "base64"}:
            raise bad_request("'encoding' must be utf-8 or base64")
        data, start, size = job.read(stream, offset, max_bytes)
        self._send_json(
            HTTPStatus.OK,
            {
                "job_id": job.job_id,
                "stream": stream,
                "data": process.render_output(data, encoding),
                "encoding": encoding,
                "offset": start,
                "next_offset": start + len(data),
                "size": size,
                "running": not job.finished.is_set(),
            },
        )

    def job_kill(self, match: re.Match[str]) -> None:
        """Kill a job's process group."""
        self._send_json(HTTPStatus.OK, self.server.jobs.kill(match["job"]).status())

    def job_delete(self, match: re.Match[str]) -> None:
        """Kill a job if needed and forget it."""
        self.server.jobs.remove(match["job"])
        self._send_json(HTTPStatus.OK, {"job_id": match["job"], "deleted": True})

    def file_read(self, _: re.Match[str]) -> None:
        """Stream a file's bytes out."""
        handle, size = files.open_for_read(self.server.workspace, required_query(self.query, "path"))
        with handle:
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            self._headers_sent = True
            files.copy_stream(handle, self.wfile, size)

    def file_write(self, _: re.Match[str]) -> None:
        """Write the request body to a file."""
        mode_text = self.query.get("mode")
        try:
            mode = int(mode_text, 8) if mode_text else None
        except ValueError:
            raise bad_request("'mode' must be octal, like 0644") from None
        if mode is not None and not 0 <= mode <= 0o7777:
            raise bad_request("'mode' must be between 0000 and 7777")
        length = None if self._body_left == -1 else self._body_left
        body = self._body()
        written = files.write_file(
            self.server.workspace, required_query(self.query, "path"), body, length, mode
        )
        self._body_left = 0
        self._send_json(HTTPStatus.OK, written)

    def file_delete(self, _: re.Match[str]) -> None:
        """Delete a file or (recursive=1) a tree."""
        path = required_query(self.query, "path")
        self._send_json(
            HTTPStatus.OK, files.delete(self.server.workspace, path, query_flag(self.query, "recursive"))
        )

    def file_list(self, _: re.Match[str]) -> None:
        """List a directory."""
        listing = files.list_dir(
            self.server.workspace, self.query.get("path", ""), query_flag(self.query, "recursive")
        )
        self._send_json(HTTPStatus.OK, listing)

    def file_stat(self, _: re.Match[str]) -> None:
        """Describe one path."""
        self._send_json(
            HTTPStatus.OK, files.stat_path(self.server.workspace, required_query(self.query, "path"))
        )

    def archive_download(self, _: re.Match[str]) -> None:
        """Stream a tar of a tree out."""
        workspace = self.server.workspace
        path = self.query.get("path", "")
        if not os.path.lexists(workspace.resolve(path)):
            raise not_found(f"no such file or directory: {path!r}", code="file_not_found")
        gzip = query_flag(self.query, "gzip")
        writer = self._start_chunked("application/gzip" if gzip else "application/x-tar")
        files.write_archive(workspace, path, writer, gzip)
        writer.close()

    def archive_upload(self, _: re.Match[str]) -> None:
        """Unpack a tar body into a directory."""
        body = self._body()
        report = files.extract_archive(self.server.workspace, self.query.get("path", ""), body)
        if isinstance(body, LimitedReader):
            body.drain()
        self._send_json(HTTPStatus.OK, report)

    def evaluate(self, _: re.Match[str]) -> None:
        """Apply a patch, run the tests, and return a reward."""
        server = self.server
        report = evaluate(
            self._json_body(),
            server.workspace,
            server.base_env,
            Verification(
                logs_dir=server.config.logs_dir,
                exec_user=server.config.exec_user,
                verifier_user=server.config.verifier_user,
                commands_ran=server.commands_ran,
            ),
        )
        self._send_json(HTTPStatus.OK, report)

    def _exec_spec(
        self,
        body: JsonObject,
        *,
        default_timeout_s: float | None = process.DEFAULT_TIMEOUT_S,
        default_output: int = process.DEFAULT_MAX_OUTPUT_BYTES,
    ) -> process.ExecSpec:
        self.server.commands_ran = True
        return process.parse_exec_spec(
            body,
            self.server.workspace,
            self.server.base_env,
            default_timeout_s=default_timeout_s,
            default_max_output_bytes=default_output,
            user=self.server.config.exec_user,
        )


def _os_message(error: OSError) -> str:
    where = f": {error.filename}" if error.filename else ""
    return f"{error.strerror or error}{where}"


def _exec_response(result: process.ProcessResult, encoding: str) -> JsonObject:
    body: JsonObject = {**result.summary(), "encoding": encoding}
    for stream, data in (("stdout", result.stdout), ("stderr", result.stderr)):
        body[stream] = process.render_output(data, encoding)
        if encoding == "utf-8":
            body[f"{stream}_binary"] = not _is_utf8(data)
    return body


def _is_utf8(data: bytearray) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


_ROUTES: list[tuple[str, re.Pattern[str], Route]] = [
    ("GET", re.compile(r"/v1/health"), AgentHandler.health),
    ("GET", re.compile(r"/v1/ready"), AgentHandler.ready),
    ("POST", re.compile(r"/v1/exec"), AgentHandler.exec),
    ("POST", re.compile(r"/v1/exec/stream"), AgentHandler.exec_stream),
    ("POST", re.compile(r"/v1/jobs"), AgentHandler.job_start),
    ("GET", re.compile(r"/v1/jobs"), AgentHandler.job_list),
    ("GET", re.compile(r"/v1/jobs/(?P<job>[0-9a-f]+)"), AgentHandler.job_status),
    ("GET", re.compile(r"/v1/jobs/(?P<job>[0-9a-f]+)/wait"), AgentHandler.job_wait),
    ("GET", re.compile(r"/v1/jobs/(?P<job>[0-9a-f]+)/output"), AgentHandler.job_output),
    ("POST", re.compile(r"/v1/jobs/(?P<job>[0-9a-f]+)/kill"), AgentHandler.job_kill),
    ("DELETE", re.compile(r"/v1/jobs/(?P<job>[0-9a-f]+)"), AgentHandler.job_delete),
    ("GET", re.compile(r"/v1/files"), AgentHandler.file_read),
    ("PUT", re.compile(r"/v1/files"), AgentHandler.file_write),
    ("DELETE", re.compile(r"/v1/files"), AgentHandler.file_delete),
    ("GET", re.compile(r"/v1/files/list"), AgentHandler.file_list),
    ("GET", re.compile(r"/v1/files/stat"), AgentHandler.file_stat),
    ("GET", re.compile(r"/v1/files/archive"), AgentHandler.archive_download),
    ("PUT", re.compile(r"/v1/files/archive"), AgentHandler.archive_upload),
    ("POST", re.compile(r"/v1/evaluate"), AgentHandler.evaluate),
    ("POST", re.compile(r"/v1/rekey"), AgentHandler.rekey),
    ("POST", re.compile(r"/v1/probe"), AgentHandler.probe),
    ("POST", re.compile(r"/v1/reset"), AgentHandler.reset),
]


def _find_route(method: str, path: str) -> tuple[Route, re.Match[str]]:
    path_matched = False
    for route_method, pattern, route in _ROUTES:
        match = pattern.fullmatch(path)
        if match is None:
            continue
        path_matched = True
        if route_method == method:
            return route, match
    if path_matched:
        raise AgentError(
            HTTPStatus.METHOD_NOT_ALLOWED, "method_not_allowed", f"{method} is not allowed on {path}"
        )
    raise not_found(f"no route {path}", code="no_route")
