"""A kubectl wrapper for tests: runs the cluster's own kubectl and decodes its JSON."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class KubectlError(Exception):
    """kubectl exited non-zero; the message is its stderr, as a user would read it."""


@dataclass(frozen=True)
class Kubectl:
    """kubectl bound to one kubeconfig and, optionally, one namespace."""

    binary: Path
    kubeconfig: Path
    namespace: str | None = None

    def in_namespace(self, namespace: str) -> Kubectl:
        return Kubectl(self.binary, self.kubeconfig, namespace)

    def run(
        self, *args: str, stdin: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.binary), f"--kubeconfig={self.kubeconfig}"]
        if self.namespace:
            argv.append(f"--namespace={self.namespace}")
        return subprocess.run([*argv, *args], input=stdin, capture_output=True, text=True, timeout=timeout)

    def __call__(self, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
        result = self.run(*args, stdin=stdin, timeout=timeout)
        if result.returncode != 0:
            raise KubectlError(result.stderr.strip() or result.stdout.strip())
        return result.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json"))

    def apply(self, manifest: dict[str, Any] | list[dict[str, Any]]) -> str:
        items = manifest if isinstance(manifest, list) else [manifest]
        document = {"apiVersion": "v1", "kind": "List", "items": items}
        return self("apply", "-f", "-", stdin=json.dumps(document))

    def create_error(self, manifest: dict[str, Any]) -> str:
        """Create `manifest` expecting a rejection; return what kubectl told the user."""
        result = self.run("create", "-f", "-", stdin=json.dumps(manifest))
        if result.returncode == 0:
            raise AssertionError(f"the apiserver accepted an object it should reject: {manifest}")
        return result.stderr


def wait_until(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.25) -> None:
    """Poll `condition` until it holds; fail with `what` if it does not within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
