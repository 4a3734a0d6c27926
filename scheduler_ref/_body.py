"""Reading and validating a JSON request body, with typed errors for each way it can be wrong.

The server parses bodies itself rather than through FastAPI's body parameters so that every
failure has its own stable code (``request_too_large``, ``invalid_json``, ``invalid_request``)
and so the hardened profile can cap the body before it is read whole.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from guard.errors import GuardError, LimitExceeded
from scheduler_ref._http_errors import from_validation_errors

M = TypeVar("M", bound=BaseModel)


async def read_body(request: Request, max_bytes: int | None) -> bytes:
    """The raw body; with ``max_bytes``, refuse a larger one without buffering past the cap."""
    if max_bytes is None:
        return await request.body()
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw, parse_constant=_no_constants)
    except (ValueError, RecursionError):
        # ValueError covers malformed JSON, bad UTF-8 and integers past Python's digit limit;
        # RecursionError is nesting deeper than the C parser allows.
        raise GuardError("invalid_json", "the request body is not valid JSON") from None
    if not isinstance(value, dict):
        raise GuardError("invalid_request", "the request body must be a JSON object")
    return value


def _no_constants(name: str) -> Any:
    # NaN and Infinity are not JSON, though Python's parser accepts them.
    raise ValueError(f"{name} is not valid JSON")


def validate(model: type[M], body: dict[str, Any]) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise from_validation_errors(exc.errors(include_url=False, include_input=False)) from None


async def read_model(request: Request, model: type[M], max_bytes: int | None) -> M:
    return validate(model, parse_json_object(await read_body(request, max_bytes)))


def _too_large(max_bytes: int) -> LimitExceeded:
    return LimitExceeded(
        "request_too_large",
        f"the request body exceeds the limit of {max_bytes} bytes",
        status=413,
    )
