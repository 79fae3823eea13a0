"""A gateway stand-in for adapter tests: lease, exec, files, evaluate and release over httpx.MockTransport.

It follows the routes and bodies of docs/gateway.md and docs/agent-api.md; exec runs nothing (it
echoes), and evaluate rewards 1.0 when the sandbox holds the file and content the test asks for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class FakeGateway:
    solved_when: tuple[str, str] = ("/workspace/answer.txt", "42")
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)  # lease -> path -> content
    released: list[str] = field(default_factory=list)
    acquired: list[dict[str, Any]] = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    @property
    def live(self) -> list[str]:
        return [lease for lease in self.files if lease not in self.released]

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/leases" and request.method == "POST":
            body = json.loads(request.content)
            self.acquired.append(body)
            views = []
            for index in range(body.get("count", 1)):
                lease = f"local.sb-{len(self.acquired)}" + (f"-{index}" if index else "")
                self.files[lease] = {}
                views.append({"id": lease, "pool": body["pool"], "sandbox": lease, "region": "local",
                              "expires_at": 0.0, "labels": body["labels"],
                              "policy_version": body.get("policy_version")})  # fmt: skip
            return httpx.Response(201, json={"leases": views, "queue_position": 0, "timings": {}})
        parts = path.split("/")  # /v1/leases/{id}/...
        lease = parts[3]
        if lease in self.released or lease not in self.files:
            return httpx.Response(410, json={"error": "lease_ended", "detail": f"lease {lease} ended"})
        if request.method == "DELETE" and len(parts) == 4:
            self.released.append(lease)
            return httpx.Response(200, json={"id": lease, "released": True})
        action = "/".join(parts[4:])
        files = self.files[lease]
        if action == "files" and request.method == "PUT":
            files[request.url.params["path"]] = request.content
            return httpx.Response(200, json={"written": len(request.content)})
        if action == "files" and request.method == "GET":
            name = request.url.params["path"]
            if name not in files:
                return httpx.Response(404, json={"error": "not_found", "detail": f"no file {name}"})
            return httpx.Response(200, content=files[name])
        if action == "exec":
            body = json.loads(request.content)
            command = body.get("shell") or " ".join(body.get("argv", []))
            if body.get("stdin"):
                command += f" <{len(body['stdin'])} bytes>"
            return httpx.Response(200, json={"exit_code": 0, "stdout": f"ran: {command}", "stderr": "",
                                             "timed_out": False, "duration_s": 0.01})  # fmt: skip
        if action == "evaluate":
            body = json.loads(request.content) if request.content else {}
            self.evaluations.append(body)
            where, content = self.solved_when
            reward = 1.0 if files.get(where, b"").decode().strip() == content else 0.0
            return httpx.Response(200, json={"reward": reward, "exec": {"stdout_tail": "1 passed"}})
        return httpx.Response(404, json={"error": "not_found", "detail": path})
