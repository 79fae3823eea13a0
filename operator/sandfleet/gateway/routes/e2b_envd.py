"""E2B's envd, served for leased sandboxes: Connect-RPC process and filesystem, and the /files routes.

The SDK reaches envd at E2B_SANDBOX_URL (here `<gateway>/e2b/envd`) and names the sandbox in its
`E2b-Sandbox-Id` header (a lease id). Its access token is the caller's own API key, so every call
is authenticated as the caller and may only reach the caller's own leases. The RPC services are the
SDK's own generated Connect applications (`e2b.envd.*_connect`), over the agent's routes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import httpx
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.filesystem import filesystem_connect, filesystem_pb
from e2b.envd.process import process_connect, process_pb
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from protobuf import Oneof
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp
from starlette.types import ASGIApp, Receive, Scope, Send

from sandfleet.core import e2b
from sandfleet.core.model import SandboxPod
from sandfleet.gateway.auth import Caller
from sandfleet.gateway.guard import is_multipart
from sandfleet.gateway.routes.deps import Authed, Parts, PartsDep
from sandfleet.gateway.routes.errors import PROBLEMS, problem_for

SANDBOX_HEADER = "e2b-sandbox-id"
# How long past a command's own deadline the agent may take to end it and answer.
ANSWER_MARGIN_S = 30.0
# File and stat calls: the agent answers these at once, or the sandbox is in trouble.
AGENT_TIMEOUT_S = 60.0
FILE_TYPES = {
    "file": filesystem_pb.FileType.FILE,
    "directory": filesystem_pb.FileType.DIRECTORY,
    "symlink": filesystem_pb.FileType.SYMLINK,
}


@dataclass(frozen=True)
class Target:
    """One caller's leased sandbox and how to call its agent."""

    sandbox: SandboxPod
    url: str
    headers: dict[str, str]


class Refused(Exception):
    """A refusal to answer in the shape of the route that met it (HTTP status, Connect code)."""

    def __init__(self, status: int, message: str, agent_code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.agent_code = agent_code

    def connect(self) -> ConnectError:
        return ConnectError(Code(e2b.connect_code(self.status, self.agent_code)), str(self))

    def http(self) -> JSONResponse:
        return JSONResponse(e2b.api_error(self.status, str(self)), status_code=self.status)


async def target(shared: Parts, who: Caller, headers: Mapping[str, str]) -> Target:
    """The caller's leased sandbox named by the SDK's sandbox header, or Refused saying why not."""
    lease_id = headers.get(SANDBOX_HEADER, "")
    if not lease_id:
        raise Refused(400, "the E2b-Sandbox-Id header is missing: create the sandbox with the SDK")
    try:
        _, sandbox = await shared.service.current(lease_id, who.name)
    except tuple(PROBLEMS) as error:
        raise Refused(problem_for(error)[0], str(error)) from None
    url = sandbox.agent_url()
    if url is None:
        raise Refused(502, "the sandbox has no address yet; kill it and create another")
    return Target(sandbox, url, shared.proxy.agent_headers(sandbox.name, sandbox.episodes))


async def agent(shared: Parts, where: Target, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One call to the sandbox's agent; a refusal or a lost sandbox becomes Refused."""
    try:
        response = await shared.proxy.client.request(
            method, where.url + path, headers=where.headers, timeout=AGENT_TIMEOUT_S, **kwargs
        )
    except httpx.TransportError as error:
        raise Refused(502, f"the sandbox's agent did not answer ({type(error).__name__})") from None
    if response.status_code >= 400:
        raise refusal(response.status_code, response.content)
    return response


def refusal(status: int, body: bytes) -> Refused:
    """The agent's error body (`{"error": {"code", "message"}}`) as Refused."""
    try:
        error = json.loads(body).get("error", {})
    except (ValueError, AttributeError):
        error = {}
    if not isinstance(error, dict):
        error = {}
    message = str(error.get("message") or f"the sandbox refused the request ({status})")
    return Refused(status, message, str(error.get("code") or ""))


async def rpc_target(shared: Parts, ctx: RequestContext[Any, Any]) -> Target:
    """The target of an RPC, authenticated from its headers (the Guard let it in the same way)."""
    headers = {k.lower(): v for k, v in ctx.request_headers.items()}
    try:
        who = await shared.authenticator.authenticate(headers.get("authorization"))
        return await target(shared, who, headers)
    except Refused as error:
        raise error.connect() from None
    except tuple(PROBLEMS) as error:
        raise Refused(problem_for(error)[0], str(error)).connect() from None


def entry_pb(entry: Mapping[str, Any]) -> filesystem_pb.EntryInfo | None:
    info = e2b.entry_info(entry)
    if info is None:
        return None
    return filesystem_pb.EntryInfo(
        name=info["name"],
        type=FILE_TYPES[info["type"]],
        path=info["path"],
        size=info["size"],
        mode=info["mode"],
        permissions=info["permissions"],
        modified_time=Timestamp.from_nanos(round(info["modified_time"] * 1e9)),
        symlink_target=info.get("symlink_target"),
        is_symlink=info["is_symlink"],
    )


def event_pb(event: e2b.ProcessEvent) -> process_pb.ProcessEvent:
    kind = process_pb.ProcessEvent
    if isinstance(event, e2b.Started):
        started: Oneof[Literal["start"], Any] = Oneof("start", kind.StartEvent(pid=event.pid))
        return kind(event=started)
    if isinstance(event, e2b.Output):
        stdout: Oneof[Literal["stdout"], bytes] = Oneof("stdout", event.data)
        stderr: Oneof[Literal["stderr"], bytes] = Oneof("stderr", event.data)
        output = stdout if event.stream == "stdout" else stderr
        data: Oneof[Literal["data"], Any] = Oneof("data", kind.DataEvent(output=output))
        return kind(event=data)
    end = kind.EndEvent(
        exit_code=event.exit_code, exited=event.exited, status=event.status, error=event.error
    )
    ended: Oneof[Literal["end"], Any] = Oneof("end", end)
    return kind(event=ended)


class ProcessService(process_connect.Process):
    """envd's Process service: commands run through the agent's streamed exec."""

    def __init__(self, shared: Parts) -> None:
        self.shared = shared

    async def start(
        self, request: process_pb.StartRequest, ctx: RequestContext[Any, Any], /
    ) -> AsyncIterator[process_pb.StartResponse]:
        where = await rpc_target(self.shared, ctx)
        config = request.process or process_pb.ProcessConfig()
        try:
            body = e2b.exec_request(
                config.cmd, list(config.args), dict(config.envs), config.cwd or None, ctx.timeout_ms
            )
        except e2b.E2BRequestError as error:
            raise ConnectError(Code.INVALID_ARGUMENT, str(error)) from None
        bound = httpx.Timeout(body["timeout_s"] + ANSWER_MARGIN_S, connect=5.0)
        client = self.shared.proxy.client
        fallback = e2b.without_bash(body)
        try:
            for attempt in (body, fallback):
                if attempt is None:
                    break
                async with client.stream(
                    "POST", where.url + "/v1/exec/stream", json=attempt, headers=where.headers, timeout=bound
                ) as response:
                    if response.status_code >= 400:
                        refused = refusal(response.status_code, await response.aread())
                        if (
                            attempt is body
                            and fallback is not None
                            and refused.agent_code == "command_not_found"
                        ):
                            continue  # no bash in this image: nothing ran, so /bin/sh runs it instead
                        raise refused.connect()
                    async for line in response.aiter_lines():
                        event = e2b.process_event(json.loads(line)) if line.strip() else None
                        if event is not None:
                            yield process_pb.StartResponse(event=event_pb(event))
                    return
        except httpx.TransportError as error:
            detail = f"the sandbox's agent stopped answering ({type(error).__name__})"
            raise ConnectError(Code.UNAVAILABLE, detail) from None


class FilesystemService(filesystem_connect.Filesystem):
    """envd's Filesystem service over the agent's file routes (list, stat, make, remove)."""

    def __init__(self, shared: Parts) -> None:
        self.shared = shared

    async def _call(self, ctx: RequestContext[Any, Any], method: str, path: str, **kw: Any) -> Any:
        where = await rpc_target(self.shared, ctx)
        try:
            return (await agent(self.shared, where, method, path, **kw)).json()
        except Refused as error:
            raise error.connect() from None

    async def stat(
        self, request: filesystem_pb.StatRequest, ctx: RequestContext[Any, Any], /
    ) -> filesystem_pb.StatResponse:
        entry = await self._call(ctx, "GET", "/v1/files/stat", params={"path": request.path})
        return filesystem_pb.StatResponse(entry=entry_pb(entry))

    async def list_dir(
        self, request: filesystem_pb.ListDirRequest, ctx: RequestContext[Any, Any], /
    ) -> filesystem_pb.ListDirResponse:
        try:
            recursive = e2b.list_depth(request.depth)
        except e2b.E2BRequestError as error:
            raise ConnectError(Code.INVALID_ARGUMENT, str(error)) from None
        params = {"path": request.path, "recursive": "1"} if recursive else {"path": request.path}
        listing = await self._call(ctx, "GET", "/v1/files/list", params=params)
        root = e2b.entry_path({"path": request.path, **listing})
        entries = []
        for entry in listing.get("entries", []):
            found = entry_pb(entry)
            if found is not None and e2b.within_depth(root, found.path, request.depth):
                entries.append(found)
        return filesystem_pb.ListDirResponse(entries=entries)

    async def make_dir(
        self, request: filesystem_pb.MakeDirRequest, ctx: RequestContext[Any, Any], /
    ) -> filesystem_pb.MakeDirResponse:
        where = await rpc_target(self.shared, ctx)
        try:
            await agent(self.shared, where, "GET", "/v1/files/stat", params={"path": request.path})
        except Refused as error:
            if error.status != 404:
                raise error.connect() from None
        else:
            raise ConnectError(Code.ALREADY_EXISTS, f"{request.path} already exists")
        try:
            # The agent has no mkdir: the sandbox user makes it, so the agent's path rule still holds.
            made = await agent(
                self.shared, where, "POST", "/v1/exec", json={"argv": ["mkdir", "-p", "--", request.path]}
            )
            result = made.json()
            if result.get("exit_code") != 0:
                raise Refused(422, str(result.get("stderr") or "mkdir failed").strip())
            entry = await agent(self.shared, where, "GET", "/v1/files/stat", params={"path": request.path})
        except Refused as error:
            raise error.connect() from None
        return filesystem_pb.MakeDirResponse(entry=entry_pb(entry.json()))

    async def remove(
        self, request: filesystem_pb.RemoveRequest, ctx: RequestContext[Any, Any], /
    ) -> filesystem_pb.RemoveResponse:
        await self._call(ctx, "DELETE", "/v1/files", params={"path": request.path, "recursive": "1"})
        return filesystem_pb.RemoveResponse()


class Services:
    """Dispatches `<prefix>/process.Process/*` and `<prefix>/filesystem.Filesystem/*` to their apps."""

    def __init__(self, shared: Parts) -> None:
        process = process_connect.ProcessASGIApplication(ProcessService(shared))
        files = filesystem_connect.FilesystemASGIApplication(FilesystemService(shared))
        # The generated apps are typed with asgiref's ASGI types: the same protocol as Starlette's.
        self.apps: dict[str, ASGIApp] = {
            "/process.Process/": cast(ASGIApp, process),
            "/filesystem.Filesystem/": cast(ASGIApp, files),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        for prefix, app in self.apps.items():
            if path.startswith(prefix):
                await app(scope, receive, send)
                return
        response = JSONResponse(e2b.api_error(404, f"envd has no route {path!r} here"), status_code=404)
        await response(scope, receive, send)


router = APIRouter(prefix=e2b.ENVD_PREFIX, tags=["e2b"], include_in_schema=False)


@router.get("/health")
async def health(request: Request, who: Authed, shared: PartsDep) -> Response:
    try:
        await target(shared, who, request.headers)
    except Refused as error:
        return error.http()
    return Response(status_code=204)


@router.get("/files")
async def read_file(request: Request, path: str, who: Authed, shared: PartsDep) -> Response:
    try:
        where = await target(shared, who, request.headers)
        found = await agent(shared, where, "GET", "/v1/files", params={"path": path})
    except Refused as error:
        return error.http()
    return Response(found.content, media_type="application/octet-stream")


@router.post("/files")
async def write_files(request: Request, who: Authed, shared: PartsDep, path: str | None = None) -> Response:
    try:
        where = await target(shared, who, request.headers)
        content_type = request.headers.get("content-type", "")
        e2b.check_encoding(request.headers.get("content-encoding", ""))
        if not is_multipart(content_type):
            # One file: streamed through to the agent as it arrives (the Guard caps it as an upload).
            name = e2b.octet_stream_path(path)
            await agent(shared, where, "PUT", "/v1/files", params={"path": name}, content=request.stream())
            return JSONResponse([e2b.write_info(name)])
        files = e2b.uploads(content_type, await request.body(), path)
        written = []
        for name, data in files:
            await agent(shared, where, "PUT", "/v1/files", params={"path": name}, content=data)
            written.append(e2b.write_info(name))
    except e2b.E2BRequestError as error:
        return JSONResponse(e2b.api_error(error.status, str(error)), status_code=error.status)
    except Refused as error:
        return error.http()
    return JSONResponse(written)
