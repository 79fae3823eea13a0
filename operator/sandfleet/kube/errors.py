"""Typed errors of the Kubernetes edge, each with a message a person can act on."""

from __future__ import annotations


class KubeConfigError(Exception):
    """Neither a kubeconfig nor an in-cluster identity could be loaded; the message says which and why."""


class KubeError(Exception):
    """An API call answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class Gone(KubeError):
    """410 Gone: the watch's resourceVersion is older than the apiserver's history; relist."""

    def __init__(self, message: str = "the watch's history is gone") -> None:
        super().__init__(410, message)
