"""Fixtures of the security tests: real gVisor sandboxes (the local e2e fixtures), and the local
cluster's operator processes and its gvisor RuntimeClass."""

from __future__ import annotations

from tests.e2e.local.conftest import agent, base_image, runsc, runtime, sandbox  # noqa: F401
from tests.integration.controller.conftest import runtime_class, start_operator  # noqa: F401
