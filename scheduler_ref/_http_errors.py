"""OpenAI-style error responses for every way a request can fail.

Every failure becomes ``{"error": {"message", "type", "param", "code"}}`` with a stable ``code``:
typed :class:`~guard.errors.GuardError` rejections keep theirs; FastAPI's request validation
(422) becomes 400 ``invalid_request`` naming the parameter, or ``invalid_json``; unknown routes
and methods become ``not_found`` / ``method_not_allowed``; ``MemoryError`` (an address-space cap
reached) becomes 500 ``out_of_memory``; anything else unexpected becomes 500 ``internal_error``
without a traceback in the body (it is logged instead).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from guard.errors import GuardError, NotFound
from scheduler_ref.errors import ServerError

logger = logging.getLogger("scheduler_ref.server")

# Messages quote pydantic's text, never the offending input: that may be attacker-sized.
_MAX_PARAM_CHARS = 200


def error_response(err: GuardError) -> JSONResponse:
    return JSONResponse(err.to_body(), status_code=err.status, headers=err.headers or None)


def param_path(loc: Sequence[int | str]) -> str | None:
    """``("body", "messages", 0, "content")`` -> ``"messages[0].content"``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("body", "query", "path", "header") and not out:
            continue
        else:
            out += f".{part}" if out else part
    return out[:_MAX_PARAM_CHARS] or None


def from_validation_errors(errors: Sequence[Mapping[str, Any]]) -> GuardError:
    """The first pydantic/FastAPI validation error as a typed 400 naming its parameter."""
    if not errors:
        return GuardError("invalid_request", "the request is invalid")
    if any(e.get("type") == "json_invalid" for e in errors):
        return GuardError("invalid_json", "the request body is not valid JSON")
    # A union reports one error per member; the deepest one is the most specific.
    first = max(errors, key=lambda e: len(_field_loc(e.get("loc", ()))))
    param = param_path(_field_loc(first.get("loc", ())))
    # Other parameters, not counting the containers or members of this one.
    others = {
        p
        for p in (param_path(_field_loc(e.get("loc", ()))) for e in errors)
        if p is not None and not (param or "").startswith(p) and not p.startswith(param or "\0")
    }
    msg = str(first.get("msg", "invalid value"))
    more = f" (and {len(others)} more invalid parameters)" if others else ""
    where = f"{param}: " if param else ""
    return GuardError("invalid_request", f"{where}{msg}{more}", param=param)


# Union members appear in pydantic's error locations as type tags ("str", "list[int]",
# "ContentPart", "function-after[...]"); they are not request fields.
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "none", "dict", "list", "ContentPart"})


def _field_loc(loc: Sequence[int | str]) -> list[int | str]:
    return [
        p
        for p in loc
        if isinstance(p, int) or not (p in _TYPE_TAGS or "[" in p or p.startswith("function-"))
    ]


def install_error_handlers(app: FastAPI, on_error: Callable[[str], None]) -> None:
    """Register the handlers; ``on_error(code)`` is called once per error response."""

    async def guard_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, GuardError)
        on_error(exc.code)
        return error_response(exc)

    async def validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        err = from_validation_errors(exc.errors())
        on_error(err.code)
        return error_response(err)

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        err: GuardError
        if exc.status_code == 404:
            err = NotFound("not_found", "no such route")
        elif exc.status_code == 405:
            err = GuardError("method_not_allowed", "method not allowed", status=405)
        else:
            err = GuardError("http_error", str(exc.detail), status=exc.status_code)
        on_error(err.code)
        return error_response(err)

    async def out_of_memory(_: Request, exc: Exception) -> JSONResponse:
        # Reaching an address-space cap (the demo's RLIMIT_AS) raises MemoryError; without a cap
        # the kernel would kill the process instead. Named, so the outcome is legible.
        logger.error("out of memory while serving a request")
        err = ServerError("out_of_memory", "the server ran out of memory")
        on_error(err.code)
        return error_response(err)

    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error", exc_info=exc)
        err = ServerError("internal_error", "the server hit an internal error")
        on_error(err.code)
        return error_response(err)

    app.add_exception_handler(GuardError, guard_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(MemoryError, out_of_memory)
    app.add_exception_handler(Exception, unexpected)
