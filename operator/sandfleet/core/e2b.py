"""E2B's API in sandfleet's terms: templates to pools or images, timeouts to TTLs, agent events to envd's.

Plain data in, plain data out: the gateway's E2B routers build the SDK's own protobuf messages from
what these return, and the agent's requests from what these build.
"""

from __future__ import annotations

import base64
import posixpath
import stat
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any
from urllib.parse import parse_qsl, unquote

# The envd version the surface claims: the SDK gates features on it. 0.5.7 is the first with
# octet-stream uploads, and past 0.4.0 the SDK sends no per-call user (every command runs as the
# sandbox user here, whatever a caller names).
ENVD_VERSION = "0.5.7"
# Where the agent's relative paths are rooted (its `--root`), so envd's absolute paths round-trip.
WORKSPACE = "/workspace"
# The template the SDK asks for when its caller names none.
SDK_DEFAULT_TEMPLATE = "base"
# The lease label that remembers which template a sandbox was created from.
TEMPLATE_LABEL = "e2b.template"
# E2B's own bounds on a sandbox's timeout; sandfleet's pools may cap it lower (the lease's max TTL).
MAX_TIMEOUT_S = 604800
# A command with no deadline still gets one: the agent ends it at this, like its own default.
UNBOUNDED_COMMAND_S = 3600.0
# The SDK's paths under which envd is reached (E2B_SANDBOX_URL) and the API is (E2B_API_URL).
API_PREFIX = "/e2b"
ENVD_PREFIX = "/e2b/envd"


class E2BRequestError(ValueError):
    """A request the E2B surface cannot carry out: `status` and a one-line message say why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class E2BTemplate:
    """What an E2B template names here: a pool, or an image (leased from a pool that serves it)."""

    name: str
    pool: str | None = None
    image: str | None = None


def template_choice(template: str | None, pools: list[str], images: Collection[str] = ()) -> E2BTemplate:
    """The pool or image a template names.

    An image reference (it has a '/', ':' or '@') is an image, and so is a name the pools serve as an
    image that no pool is called (a local layout is leased by its bare tag, `busybox`); anything
    else names a pool. The SDK's default template (`base`) means the only pool when there is exactly
    one and none is called `base`.
    """
    name = (template or SDK_DEFAULT_TEMPLATE).strip()
    if not name:
        raise E2BRequestError(400, "templateID is empty: name a pool or an image")
    if any(mark in name for mark in "/:@") or (name in images and name not in pools):
        return E2BTemplate(name=name, image=name)
    if name == SDK_DEFAULT_TEMPLATE and name not in pools:
        if len(pools) != 1:
            listed = ", ".join(sorted(pools)) or "none"
            raise E2BRequestError(
                400, f"template 'base' is ambiguous here: name one of the pools ({listed}) or an image"
            )
        return E2BTemplate(name=name, pool=pools[0])
    return E2BTemplate(name=name, pool=name)


def lease_ttl(timeout: object) -> int | None:
    """A lease TTL from an E2B `timeout` (seconds); None leaves the pool's default."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int):
        raise E2BRequestError(400, f"timeout must be a whole number of seconds, not {timeout!r}")
    if not 1 <= timeout <= MAX_TIMEOUT_S:
        raise E2BRequestError(400, f"timeout must be between 1 and {MAX_TIMEOUT_S} seconds, not {timeout}")
    return timeout


def string_map(value: object, field: str) -> dict[str, str]:
    """An E2B string map (metadata, envVars); None is empty."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise E2BRequestError(400, f"{field} must map strings to strings")
    return dict(value)


def acquire_body(body: Mapping[str, Any], pools: list[str], images: Collection[str] = ()) -> dict[str, Any]:
    """The sandfleet acquire body for an E2B `POST /sandboxes` body.

    E2B metadata become lease labels (so `run` and `episode` work as with any lease); the template
    is remembered in a label. Per-sandbox env vars are refused: a lease carries no environment, and
    each command takes its own.
    """
    if string_map(body.get("envVars"), "envVars"):
        raise E2BRequestError(
            400, "envVars at creation are not supported here: pass envs to each commands.run"
        )
    choice = template_choice(_optional_str(body.get("templateID"), "templateID"), pools, images)
    labels = {**string_map(body.get("metadata"), "metadata"), TEMPLATE_LABEL: choice.name}
    acquire: dict[str, Any] = {"labels": labels, "ttl_seconds": lease_ttl(body.get("timeout"))}
    if choice.pool is not None:
        acquire["pool"] = choice.pool
    if choice.image is not None:
        acquire["image"] = choice.image
    return acquire


def _optional_str(value: object, field: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise E2BRequestError(400, f"{field} must be a string")
    return value


def created(lease_id: str, template: str, client_id: str, access_token: str) -> dict[str, Any]:
    """E2B's `Sandbox` answer to a create (or a connect): the lease is the sandbox."""
    return {
        "templateID": template,
        "sandboxID": lease_id,
        "clientID": client_id,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": access_token,
        "domain": None,
    }


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat().replace("+00:00", "Z")


def detail(
    lease_id: str,
    template: str,
    client_id: str,
    acquired_at: float,
    expires_at: float,
    metadata: Mapping[str, str],
) -> dict[str, Any]:
    """E2B's `SandboxDetail` for a lease; resources are not known per lease here, so they read 0."""
    return {
        "templateID": template,
        "sandboxID": lease_id,
        "clientID": client_id,
        "startedAt": _iso(acquired_at),
        "endAt": _iso(expires_at),
        "envdVersion": ENVD_VERSION,
        "cpuCount": 0,
        "memoryMB": 0,
        "diskSizeMB": 0,
        "state": "running",
        "metadata": {k: v for k, v in metadata.items() if k != TEMPLATE_LABEL},
    }


def metadata_filter(query: str | None) -> dict[str, str]:
    """The metadata a `Sandbox.list` filters by (the SDK quotes each key and value, then url-encodes)."""
    pairs = parse_qsl(query or "", keep_blank_values=True)
    return {unquote(key): unquote(value) for key, value in pairs}


def listed(labels: Mapping[str, str], metadata: Mapping[str, str], states: list[str], template: str) -> bool:
    """Whether a running sandbox with these labels is in a `Sandbox.list` with these filters."""
    if states and "running" not in states:
        return False
    if template and labels.get(TEMPLATE_LABEL) != template:
        return False
    return all(labels.get(key) == value for key, value in metadata.items())


def api_error(status: int, message: str) -> dict[str, Any]:
    """E2B's error body (the API's and envd's HTTP routes both answer this shape)."""
    return {"code": status, "message": message}


def bearer(path: str, headers: Mapping[str, str]) -> str | None:
    """The bearer token an E2B request carries, or None when it is not an E2B request or has none.

    The SDK sends its API key as `X-API-KEY` to the API and the sandbox's access token (here the
    same key) as `X-Access-Token` to envd; any `Authorization` it sends to envd is a user name
    (`Basic user:`), which sandfleet does not take, so the token replaces it.
    """
    if path.startswith(ENVD_PREFIX + "/"):
        return headers.get("x-access-token") or None
    if path.startswith(API_PREFIX + "/"):
        return headers.get("x-api-key") or None
    return None


# -- commands ------------------------------------------------------------------------------------


def exec_request(
    cmd: str, args: list[str], envs: Mapping[str, str], cwd: str | None, timeout_ms: float | None
) -> dict[str, Any]:
    """The agent's streamed-exec body for envd's `Process.Start`: argv as given, output as base64."""
    if not cmd:
        raise E2BRequestError(400, "process.cmd is empty: name the program to run")
    seconds = timeout_ms / 1000 if timeout_ms is not None and timeout_ms > 0 else UNBOUNDED_COMMAND_S
    body: dict[str, Any] = {"argv": [cmd, *args], "timeout_s": seconds, "encoding": "base64"}
    if envs:
        body["env"] = dict(envs)
    if cwd:
        body["cwd"] = cwd
    return body


# The SDK runs every `commands.run` as `/bin/bash -l -c CMD`: E2B's own templates all have bash.
SDK_SHELL = ("/bin/bash", "-l", "-c")


def without_bash(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The exec body again with `/bin/sh -l -c CMD` for the SDK's shell form; None for any other command.

    For an image without bash (busybox, Alpine): the gateway runs this after the agent answered
    `command_not_found` for /bin/bash, so an image that has bash always gets bash.
    """
    argv = body.get("argv")
    if isinstance(argv, list) and len(argv) == len(SDK_SHELL) + 1 and tuple(argv[:-1]) == SDK_SHELL:
        return {**body, "argv": ["/bin/sh", "-l", "-c", argv[-1]]}
    return None


@dataclass(frozen=True)
class Started:
    pid: int


@dataclass(frozen=True)
class Output:
    stream: str  # stdout or stderr
    data: bytes


@dataclass(frozen=True)
class Ended:
    exit_code: int
    exited: bool
    status: str
    error: str | None


ProcessEvent = Started | Output | Ended


def process_event(event: Mapping[str, Any]) -> ProcessEvent | None:
    """The envd process event for one of the agent's NDJSON exec events (None: nothing to tell)."""
    kind = event.get("event")
    if kind == "start":
        pid = event.get("pid")
        return Started(pid=pid if isinstance(pid, int) and pid > 0 else 0)
    if kind in ("stdout", "stderr"):
        data = event.get("data")
        if not isinstance(data, str) or not data:
            return None
        return Output(stream=str(kind), data=base64.b64decode(data))
    if kind == "exit":
        return ended(event)
    return None


def ended(summary: Mapping[str, Any]) -> Ended:
    """The envd end event for the agent's exec summary, with Go's wording of how a process ended."""
    code = summary.get("exit_code")
    exit_code = code if isinstance(code, int) else -1
    signal = summary.get("signal")
    error = None
    if summary.get("timed_out"):
        timeout = summary.get("duration_s")
        error = f"the command timed out (after {timeout} s) and was killed with its processes"
    if isinstance(signal, int) and signal > 0:
        return Ended(exit_code=exit_code, exited=False, status=f"signal: {signal}", error=error)
    return Ended(exit_code=exit_code, exited=True, status=f"exit status {exit_code}", error=error)


# -- files ---------------------------------------------------------------------------------------


def absolute(agent_path: str) -> str:
    """An agent path (relative to its root) as envd names it: absolute."""
    return posixpath.normpath(posixpath.join(WORKSPACE, agent_path))


def entry_path(entry: Mapping[str, Any]) -> str:
    """Where an agent's file entry (or listing) is, absolute: as the agent says, else under /workspace.

    An image's working area is its WorkingDir, so only an agent too old to say is read as /workspace.
    """
    said = entry.get("absolute")
    return said if isinstance(said, str) and said.startswith("/") else absolute(str(entry.get("path", ".")))


FILE_TYPES = {"file": "file", "directory": "directory", "symlink": "symlink"}


def entry_info(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """The envd `EntryInfo` fields for one of the agent's file entries (None: a kind envd cannot name)."""
    kind = FILE_TYPES.get(str(entry.get("type")))
    if kind is None:
        return None
    mode = int(str(entry.get("mode", "0")), 8)
    type_bits = {"file": stat.S_IFREG, "directory": stat.S_IFDIR, "symlink": stat.S_IFLNK}[kind]
    info: dict[str, Any] = {
        "name": str(entry.get("name", "")),
        "type": kind,
        "path": entry_path(entry),
        "size": int(entry.get("size") or 0),
        "mode": mode,
        "permissions": stat.filemode(type_bits | mode),
        "modified_time": float(entry.get("mtime") or 0.0),
        "is_symlink": kind == "symlink",
    }
    if kind == "symlink" and isinstance(entry.get("target"), str):
        info["symlink_target"] = entry["target"]
    return info


def list_depth(depth: int) -> bool:
    """Whether an envd `ListDir` depth asks for the whole tree (the agent lists one level or all)."""
    if depth < 0:
        raise E2BRequestError(400, "depth must be at least 1")
    return depth > 1


def within_depth(root: str, path: str, depth: int) -> bool:
    """Whether `path` lies at most `depth` levels below `root` (0: no limit)."""
    if depth <= 0:
        return True
    rel = posixpath.relpath(path, root)
    return rel.count("/") < depth


def check_encoding(content_encoding: str) -> None:
    """Refuse an upload body the gateway would store still encoded (the SDK's `gzip=True`)."""
    if content_encoding.strip().lower() not in ("", "identity"):
        raise E2BRequestError(
            415, f"uploads with Content-Encoding {content_encoding!r} are not served: write without gzip"
        )


def octet_stream_path(path: str | None) -> str:
    """Where an octet-stream envd `POST /files` (one file, its bytes the body) writes: its `path`."""
    if not path:
        raise E2BRequestError(400, "the path query parameter is required for an octet-stream upload")
    return path


def uploads(content_type: str, body: bytes, path: str | None) -> list[tuple[str, bytes]]:
    """The (path, bytes) an envd `POST /files` carries: one octet-stream body, or multipart parts.

    A multipart part names its destination in its filename (the SDK puts the whole path there); a
    lone part may rely on the `path` query parameter instead.
    """
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind != "multipart/form-data":
        return [(octet_stream_path(path), body)]
    head = f"Content-Type: {content_type}\r\n\r\n".encode("latin-1")
    message = BytesParser(policy=HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise E2BRequestError(400, "the multipart body has no parts")
    files = []
    for part in message.iter_parts():
        payload = part.get_payload(decode=True)
        name = part.get_filename() or path
        if not name:
            raise E2BRequestError(400, "a multipart part names no file and no path was given")
        files.append((name, payload if isinstance(payload, bytes) else b""))
    if len(files) == 1 and path:
        files = [(path, files[0][1])]
    if not files:
        raise E2BRequestError(400, "the multipart body has no files")
    return files


def write_info(path: str) -> dict[str, str]:
    """The envd answer entry for one written file."""
    return {"name": posixpath.basename(path), "type": "file", "path": absolute(path)}


# The agent's refusals as Connect codes (the SDK turns them into its own exceptions).
CONNECT_CODES = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    409: "aborted",
    410: "not_found",
    413: "resource_exhausted",
    422: "invalid_argument",
    429: "resource_exhausted",
    502: "unavailable",
    503: "unavailable",
    504: "deadline_exceeded",
}


def connect_code(status: int, agent_code: str = "") -> str:
    """The Connect code for an agent's (or the gateway's) refusal with HTTP `status`."""
    if agent_code == "file_not_found":
        return "not_found"
    return CONNECT_CODES.get(status, "internal")
