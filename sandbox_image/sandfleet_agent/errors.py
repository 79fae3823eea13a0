"""The agent's error type: every failure a client can cause maps to an HTTP status and a stable code."""

from __future__ import annotations

from http import HTTPStatus


class AgentError(Exception):
    """A request the agent refuses, with a stable machine-readable code and a human message."""

    def __init__(self, status: HTTPStatus, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def to_json(self) -> dict[str, object]:
        """Render as the body every error response carries."""
        return {"error": {"code": self.code, "message": self.message}}


def bad_request(message: str, code: str = "bad_request") -> AgentError:
    """Build the error for a malformed request."""
    return AgentError(HTTPStatus.BAD_REQUEST, code, message)


def not_found(message: str, code: str = "not_found") -> AgentError:
    """Build the error for something that does not exist."""
    return AgentError(HTTPStatus.NOT_FOUND, code, message)


def unprocessable(message: str, code: str) -> AgentError:
    """Build the error for a well-formed request that cannot be carried out."""
    return AgentError(HTTPStatus.UNPROCESSABLE_ENTITY, code, message)
