"""Typed errors shared by the guard and the reference scheduler.

Every rejection carries a stable ``code`` (also used as a Prometheus label value), an HTTP
status and a human message, and renders as OpenAI's error body so existing clients surface it.
"""

from __future__ import annotations

from typing import Any


class GuardError(Exception):
    """A request was refused. Subclasses fix the HTTP status and the error type."""

    status: int = 400
    type: str = "invalid_request_error"

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        status: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        if status is not None:
            self.status = status
        self.headers = headers or {}

    def to_body(self) -> dict[str, Any]:
        """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class LimitExceeded(GuardError):
    """A budget or limit was crossed: depth, tokens, bytes, steps or time."""


class TemplateError(GuardError):
    """A prompt or chat template is malformed or refused (not a budget)."""


class RateLimited(GuardError):
    """The caller has used up its request or token allowance for now."""

    status = 429
    type = "rate_limit_error"


class Overloaded(GuardError):
    """The server cannot take more work right now (queue full, capacity)."""

    status = 503
    type = "server_error"


class NotFound(GuardError):
    status = 404
