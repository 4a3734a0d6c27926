"""Envoy's ext_proc messages, read and built (``envoy.service.ext_proc.v3``).

Header values arrive in ``raw_value`` (Envoy 1.28 on) or ``value`` (older); names are lower
case. Answers are built here so that the processor speaks in the guard's terms: continue
(with header and body mutations), or an immediate response carrying a
:class:`~guard.errors.GuardError` exactly as the proxy sends it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2

from guard.errors import GuardError

__all__ = [
    "Headers",
    "body_response",
    "headers_of",
    "headers_response",
    "immediate_error",
    "pb",
]

Headers = list[tuple[bytes, bytes]]

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
_JSON = "application/json"


def headers_of(header_map: Any) -> Headers:
    """``(name, value)`` pairs of an Envoy ``HeaderMap``, pseudo-headers included."""
    out: Headers = []
    for h in header_map.headers:
        raw = h.raw_value
        out.append((h.key.encode("latin-1"), raw if raw else h.value.encode("latin-1")))
    return out


# The ext_proc filter's attributes (its `request_attributes`) arrive under its own name.
_FILTER = "envoy.filters.http.ext_proc"


def source_address(request: Any) -> str:
    """The downstream peer Envoy says sent ``request`` (its ``source.address`` attribute, the
    filter configured with ``request_attributes: [source.address]``); ``""``: not sent."""
    if _FILTER not in request.attributes:
        return ""
    value = request.attributes[_FILTER].fields.get("source.address")
    return value.string_value if value is not None else ""


def _build_option(name: str, value: str) -> Any:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=name, raw_value=value.encode("latin-1")),
        append_action=_OVERWRITE,
    )


# The header values that repeat (accept-encoding: identity, x-accel-buffering: no) are built once.
_CONSTANT_OPTIONS = {
    (name, value): _build_option(name, value)
    for name, value in (("accept-encoding", "identity"), ("x-accel-buffering", "no"))
}


def _option(name: str, value: str) -> Any:
    option = _CONSTANT_OPTIONS.get((name, value))
    return option if option is not None else _build_option(name, value)


def header_mutation(set_headers: Iterable[tuple[str, str]] = (), remove: Sequence[str] = ()) -> Any:
    return pb.HeaderMutation(
        set_headers=[_option(name, value) for name, value in set_headers],
        remove_headers=list(remove),
    )


def _common(
    set_headers: Sequence[tuple[str, str]], remove: Sequence[str], body: bytes | None
) -> Any:
    common = pb.CommonResponse()
    if set_headers or remove:
        common.header_mutation.CopyFrom(header_mutation(set_headers, remove))
    if body is not None:
        common.body_mutation.body = body
    return common


# The answers that carry nothing but "go on", built once (immutable once serialised by gRPC).
_PLAIN = {
    "request_headers": pb.ProcessingResponse(request_headers=pb.HeadersResponse()),
    "response_headers": pb.ProcessingResponse(response_headers=pb.HeadersResponse()),
    "request_body": pb.ProcessingResponse(request_body=pb.BodyResponse()),
    "response_body": pb.ProcessingResponse(response_body=pb.BodyResponse()),
}
_CLEARED = pb.ProcessingResponse(
    response_body=pb.BodyResponse(
        response=pb.CommonResponse(body_mutation=pb.BodyMutation(clear_body=True))
    )
)


def headers_response(
    phase: str, set_headers: Sequence[tuple[str, str]] = (), remove: Sequence[str] = ()
) -> Any:
    """Continue after ``phase``'s headers (``request_headers`` or ``response_headers``)."""
    if not set_headers and not remove:
        return _PLAIN[phase]
    common = _common(set_headers, remove, None)
    return pb.ProcessingResponse(**{phase: pb.HeadersResponse(response=common)})


def body_response(
    phase: str,
    body: bytes | None = None,
    *,
    set_headers: Sequence[tuple[str, str]] = (),
    remove: Sequence[str] = (),
    clear: bool = False,
) -> Any:
    """Continue after a body message of ``phase`` (``request_body`` or ``response_body``):
    the chunk replaced by ``body`` (None: kept as it is; ``clear``: dropped); header mutations
    take effect only for a buffered body."""
    if body is None and not set_headers and not remove:
        if clear and phase == "response_body":
            return _CLEARED
        if not clear:
            return _PLAIN[phase]
    common = _common(set_headers, remove, body)
    if clear:
        common.body_mutation.clear_body = True
    return pb.ProcessingResponse(**{phase: pb.BodyResponse(response=common)})


def immediate_error(err: GuardError, request_id: str) -> Any:
    """The proxy's answer to a refusal, as Envoy's local reply: the status, the OpenAI error
    body, ``content-type``, ``x-request-id`` and the error's own headers (``retry-after``,
    ``allow``)."""
    data = json.dumps(err.to_body(), separators=(",", ":")).encode()
    status = err.status if 400 <= err.status <= 599 else 400
    headers = [("content-type", _JSON), ("x-request-id", request_id)]
    headers.extend((k.lower(), v) for k, v in err.headers.items() if k.lower() != "connection")
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=header_mutation(headers),
            body=data,
            details=f"schedguard_{err.code}"[:128],
        )
    )
