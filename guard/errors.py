"""The guard's exceptions, all in one place (the reference scheduler shares :class:`GuardError`).

- :class:`GuardError` and its subclasses are refusals and failures a client sees: each carries a
  stable ``code`` (also used as a Prometheus label value), an HTTP status and a human message,
  and renders as OpenAI's error body so existing clients surface it.
- :class:`TransportError` and its subclasses are the upstream client's failures
  (:mod:`guard.http._client`); :class:`~guard.http.Upstream` maps them to
  :class:`UpstreamError`.
- :class:`RegexRejected`, :class:`ScanLimitError` and :class:`FormatRefused` are what the
  scanners raise; their callers turn them into a :class:`GuardError` with the right code.
- :class:`PolicyError`: an invalid policy (a configuration error, not a request's).

Not here, on purpose: ``TemplateRaised`` (:mod:`guard.jinja`) subclasses jinja2's
``TemplateError``, as Hugging Face's ``raise_exception`` does, and this module imports nothing
outside the standard library; and a few module-private signals that never leave their module
(the JSON reader's hook refusals, the connection pool's stale-connection retry).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ClientDisconnected",
    "ClientTooSlow",
    "ConnectFailed",
    "FormatRefused",
    "GuardError",
    "InternalError",
    "LimitExceeded",
    "Misconfigured",
    "NotFound",
    "Overloaded",
    "PolicyError",
    "RateLimited",
    "RegexRejected",
    "ResponseBroken",
    "ScanLimitError",
    "TemplateError",
    "TransportError",
    "UpstreamError",
    "UpstreamTimeout",
]


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


class InternalError(GuardError):
    """A bug in the guard (never bad input): 500, no detail in the body, the cause logged."""

    status = 500
    type = "server_error"

    def __init__(self) -> None:
        super().__init__("internal_error", "the guard failed; the error was logged")


class Misconfigured(GuardError):
    """The guard's deployment cannot serve the request as configured (not the client's fault:
    say, an Envoy filter that does not send the body the checks need)."""

    status = 500
    type = "server_error"


class ClientDisconnected(GuardError):
    """The client went away while we were reading; never sent (nobody is listening)."""

    status = 499

    def __init__(self) -> None:
        super().__init__("client_disconnected", "the client disconnected")


class ClientTooSlow(GuardError):
    """The client stopped reading the response (the gateway cuts it)."""

    status = 499

    def __init__(self) -> None:
        super().__init__("client_too_slow", "the client stopped reading the response")


class UpstreamError(GuardError):
    """The upstream failed: unreachable or broken (502), or too slow (504)."""

    status = 502
    type = "server_error"


# -- the upstream client's transport failures ---------------------------------------------------


class TransportError(Exception):
    """The exchange with the upstream failed."""


class ConnectFailed(TransportError):
    """No connection could be made."""


class ResponseBroken(TransportError):
    """The connection broke or the response was not valid HTTP/1.1 within the caps."""


class UpstreamTimeout(TransportError, TimeoutError):
    """A connect, read or total timeout ran out."""


# -- what the scanners raise ------------------------------------------------------------------


class RegexRejected(Exception):
    """A regex (or grammar) is refused. ``message`` never contains pattern text."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ScanLimitError(Exception):
    """A chat template crossed a scan limit; ``kind`` is ``size``, ``block``, ``expr`` or
    ``tokens``."""

    def __init__(self, kind: str, value: int, limit: int) -> None:
        super().__init__(f"{kind} {value} exceeds {limit}")
        self.kind = kind
        self.value = value
        self.limit = limit


class FormatRefused(Exception):
    """A format string cannot be bounded (or its widths are too big); the message says why."""


# -- configuration ----------------------------------------------------------------------------


class PolicyError(ValueError):
    """The policy is invalid. ``problems`` holds one ``"path: message"`` line per problem."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = problems
        self.source = source
        where = f" ({source})" if source else ""
        super().__init__(f"invalid policy{where}:\n" + "\n".join(f"  {p}" for p in problems))
