"""A real registry on loopback for tests: Debian's docker-registry (CNCF distribution), TLS and basic auth.

- `start_registry(directory)`: a self-signed CA and a server certificate for 127.0.0.1 made with
  openssl, an htpasswd (bcrypt, `htpasswd -B`), the registry on a free port; `LocalRegistry` holds
  what a client needs (`cert_dir` with the CA as `ca.crt`, a containers-auth.json `auth_file`) and
  pushes images with skopeo.
- `FaultyFront`: an HTTPS front on loopback, with the registry's certificate, that forwards to it
  and answers chosen requests (say, blob GETs: mid-pull) with 503 or 429 instead, N times or always.

Needs `docker-registry`, `skopeo`, `openssl` and `htpasswd` (apache2-utils): hack/bootstrap installs them.
Nothing here reaches beyond loopback.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import re
import shutil
import socket
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REF_NAME = "org.opencontainers.image.ref.name"
USER = "sandfleet-test"
PASSWORD = "registry-secret-1"
TOOLS = ("docker-registry", "skopeo", "openssl", "htpasswd")


def _run(argv: list[str], cwd: Path | None = None) -> str:
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr[-2000:]}")
    return result.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def missing_tools() -> list[str]:
    """The tools a registry test needs that this host lacks."""
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA (`ca.crt` alone in `directory/ca`, the form skopeo's cert dirs take) and a cert for 127.0.0.1."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_dir = directory / "ca"
    ca_dir.mkdir(exist_ok=True)
    openssl = ["openssl"]
    _run([*openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout", "ca.key",
          "-out", "ca/ca.crt", "-subj", "/CN=sandfleet test CA"], cwd=directory)  # fmt: skip
    _run([*openssl, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
          "-out", "server.csr", "-subj", "/CN=127.0.0.1"], cwd=directory)  # fmt: skip
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _run([*openssl, "x509", "-req", "-in", "server.csr", "-CA", "ca/ca.crt", "-CAkey", "ca.key",
          "-CAcreateserial", "-days", "2", "-out", "server.crt", "-extfile", "san.cnf"],
         cwd=directory)  # fmt: skip
    return ca_dir, directory / "server.crt", directory / "server.key"


def write_auth_file(path: Path, host: str, user: str, password: str) -> Path:
    """A containers-auth.json (skopeo's --authfile) with credentials for `host`."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    path.write_text(json.dumps({"auths": {host: {"auth": token}}}))
    path.chmod(0o600)
    return path


@dataclass
class LocalRegistry:
    """A running docker-registry on loopback with TLS and basic auth."""

    host: str
    cert_dir: Path
    auth_file: Path
    server_cert: Path
    server_key: Path
    directory: Path
    process: subprocess.Popen[bytes]
    pushed: dict[str, str] = field(default_factory=dict)

    def push(self, source: str, name: str, *, every_platform: bool = False) -> str:
        """Copy `source` (any skopeo reference, e.g. `oci:LAYOUT:TAG`) to `HOST/name`; its manifest digest.

        `every_platform`: an index is pushed whole (skopeo's --all), not only this host's image of it.
        """
        digest_file = self.directory / "pushed.digest"
        _run(["skopeo", "copy", "--quiet", *(["--all"] if every_platform else []),
              "--dest-cert-dir", str(self.cert_dir), "--dest-authfile", str(self.auth_file),
              "--digestfile", str(digest_file), source, f"docker://{self.host}/{name}"])  # fmt: skip
        digest = digest_file.read_text().strip()
        self.pushed[name] = digest
        return digest

    def stop(self) -> None:
        """Stop the registry (its storage stays in `directory` until the test's tmp dir goes)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_registry(directory: Path, user: str = USER, password: str = PASSWORD) -> LocalRegistry:
    """docker-registry on a free loopback port, TLS with a fresh CA, basic auth for `user`."""
    missing = missing_tools()
    if missing:
        raise RuntimeError(f"the registry tests need {', '.join(missing)} (hack/bootstrap installs them)")
    directory.mkdir(parents=True, exist_ok=True)
    ca_dir, cert, key = make_certificates(directory / "tls")
    htpasswd = directory / "htpasswd"
    htpasswd.write_text(_run(["htpasswd", "-Bbn", user, password]))
    port = _free_port()
    host = f"127.0.0.1:{port}"
    config = directory / "config.yml"
    config.write_text(
        json.dumps(  # YAML is a superset of JSON
            {
                "version": 0.1,
                "log": {"level": "warn", "accesslog": {"disabled": True}},
                "storage": {
                    "filesystem": {"rootdirectory": str(directory / "data")},
                    "delete": {"enabled": True},
                },
                "http": {"addr": host, "tls": {"certificate": str(cert), "key": str(key)}},
                "auth": {"htpasswd": {"realm": "sandfleet-test", "path": str(htpasswd)}},
            }
        )
    )
    log = (directory / "registry.log").open("wb")
    process = subprocess.Popen(
        ["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
    )
    registry = LocalRegistry(
        host=host,
        cert_dir=ca_dir,
        auth_file=write_auth_file(directory / "auth.json", host, user, password),
        server_cert=cert,
        server_key=key,
        directory=directory,
        process=process,
    )
    context = ssl.create_default_context(cafile=str(ca_dir / "ca.crt"))
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"docker-registry exited: {(directory / 'registry.log').read_text()[-2000:]}")
        try:
            connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=2)
            connection.request("GET", "/v2/")
            status = connection.getresponse().status
            connection.close()
            if status == 401:  # up, and asking for credentials
                return registry
        except OSError:
            pass
        if time.monotonic() > deadline:
            registry.stop()
            raise RuntimeError("docker-registry did not answer within 30 s")
        time.sleep(0.1)


@dataclass
class Fault:
    """Answer requests whose path matches `path` with `status`, `times` times (None: always)."""

    path: str
    status: int
    times: int | None = None
    methods: tuple[str, ...] = ("GET",)
    injected: int = 0


class FaultyFront:
    """An HTTPS front for a LocalRegistry on its own loopback port (same certificate, same CA).

    Forwards every request to the registry, but those a Fault matches: they get its status with an
    empty body. `host` is what a client names instead of the registry's; `requests` counts all.
    """

    def __init__(self, registry: LocalRegistry, faults: list[Fault]) -> None:
        self.registry = registry
        self.faults = faults
        self.requests: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()
        upstream = ssl.create_default_context(cafile=str(registry.cert_dir / "ca.crt"))
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def _handle(self) -> None:
                fault = front._fault_for(self.command, self.path)
                if fault is not None:
                    front._record(self.command, self.path, fault.status)
                    self.send_response(fault.status)
                    self.send_header("Content-Length", "0")
                    self.send_header("Content-Type", "text/plain")
                    if fault.status == 429:  # skopeo waits this long before its own retries of a 429
                        self.send_header("Retry-After", "0")
                    self.end_headers()
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                host, port = front.registry.host.rsplit(":", 1)
                connection = http.client.HTTPSConnection(host, int(port), context=upstream, timeout=60)
                # Header by header: skopeo sends several Accept lines, and the registry needs each.
                connection.putrequest(self.command, self.path, skip_accept_encoding=True)
                for key, value in self.headers.items():
                    if key.lower() not in ("host", "connection", "content-length"):
                        connection.putheader(key, value)
                if body is not None:
                    connection.putheader("Content-Length", str(len(body)))
                connection.endheaders(body)
                response = connection.getresponse()
                data = response.read()
                front._record(self.command, self.path, response.status)
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                        value = value.replace(front.registry.host, front.host)
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                connection.close()

            do_GET = _handle  # noqa: N815
            do_HEAD = _handle  # noqa: N815
            do_POST = _handle  # noqa: N815
            do_PUT = _handle  # noqa: N815
            do_PATCH = _handle  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(registry.server_cert), str(registry.server_key))
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        # The auth file names hosts: the front's gets the same credentials.
        self.auth_file = write_auth_file(
            registry.directory / f"auth-{self.server.server_address[1]}.json", self.host, USER, PASSWORD
        )
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _fault_for(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                matches = method in fault.methods and re.search(fault.path, path)
                if matches and (fault.times is None or fault.injected < fault.times):
                    fault.injected += 1
                    return fault
        return None

    def _record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self.requests.append((method, path, status))

    def __enter__(self) -> FaultyFront:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _write_blob(layout: Path, data: dict[str, object]) -> tuple[str, int]:
    raw = json.dumps(data, separators=(",", ":")).encode()
    digest = hashlib.sha256(raw).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(raw)
    return f"sha256:{digest}", len(raw)


def variant_layout(
    layout: Path, tag: str, directory: Path, arch: str = "arm64", labels: dict[str, str] | None = None
) -> Path:
    """A copy of an OCI layout with the image `tag`'s config changed (same layers), as two tags.

    `single-<arch>`: the one image, its config saying `arch` (and carrying `labels`); `index-<arch>`:
    an image index whose only entry is that image, for linux/<arch> (for arm64: what a registry
    serves for an image without amd64).
    """
    target = directory / f"layout-{arch}-{len(labels or {})}"
    shutil.copytree(layout, target)
    index = json.loads((target / "index.json").read_text())
    (entry,) = [m for m in index["manifests"] if m.get("annotations", {}).get(REF_NAME) == tag]
    blobs = target / "blobs" / "sha256"
    manifest = json.loads((blobs / entry["digest"].split(":", 1)[1]).read_bytes())
    config = json.loads((blobs / manifest["config"]["digest"].split(":", 1)[1]).read_bytes())
    config["architecture"] = arch
    if labels:
        config.setdefault("config", {})["Labels"] = {**(config["config"].get("Labels") or {}), **labels}
    config_digest, config_size = _write_blob(target, config)
    manifest["config"] = {**manifest["config"], "digest": config_digest, "size": config_size}
    manifest_digest, manifest_size = _write_blob(target, manifest)
    image = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
             "size": manifest_size}  # fmt: skip
    image_index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                   "manifests": [{**image, "platform": {"architecture": arch, "os": "linux"}}]}  # fmt: skip
    index_digest, index_size = _write_blob(target, image_index)
    index["manifests"] = [
        {**image, "annotations": {REF_NAME: f"single-{arch}"}},
        {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": index_digest, "size": index_size,
         "annotations": {REF_NAME: f"index-{arch}"}},
    ]  # fmt: skip
    (target / "index.json").write_text(json.dumps(index))
    return target
