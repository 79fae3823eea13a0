"""Fixtures of the security suite: real gVisor sandboxes from the local e2e fixtures."""

from tests.e2e.local.conftest import agent, base_image, runsc, runtime, sandbox

__all__ = ["agent", "base_image", "runsc", "runtime", "sandbox"]
