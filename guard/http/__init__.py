"""The guard's HTTP layer: request framing under caps, the httptools server protocol, the
pooled upstream client, SSE relay and client-disconnect hooks.
"""

from __future__ import annotations

from guard.errors import ClientDisconnected, UpstreamError
from guard.http._client import PRIORITY_HEADER, UpstreamConfig, UpstreamKind
from guard.http._connections import (
    ConnectionLimits,
    raise_nofile_limit,
)
from guard.http._disconnect import (
    DISCONNECT_EXTENSION,
    DisconnectHook,
)
from guard.http._framing import (
    FramingLimits,
    RequestHead,
    check_declared_body,
    decode_body,
    inspect_head,
    read_body,
    usable_request_id,
)
from guard.http._protocol import (
    GuardHttpToolsProtocol,
    configure,
    head_refusals,
    protocol_with,
)
from guard.http._read_ahead import Pipe, ReadAheadBudget
from guard.http._sse_relay import (
    SseRelay,
    error_event,
)
from guard.http._upstream import (
    HOP_BY_HOP,
    PROBE_HEADER,
    Upstream,
    UpstreamResponse,
    dropped_headers,
    max_model_len_of,
    response_headers,
    serves_vllm,
    upstream_kind_of,
)

__all__ = [
    "DISCONNECT_EXTENSION",
    "HOP_BY_HOP",
    "PRIORITY_HEADER",
    "PROBE_HEADER",
    "ClientDisconnected",
    "ConnectionLimits",
    "DisconnectHook",
    "FramingLimits",
    "GuardHttpToolsProtocol",
    "Pipe",
    "ReadAheadBudget",
    "RequestHead",
    "SseRelay",
    "Upstream",
    "UpstreamConfig",
    "UpstreamError",
    "UpstreamKind",
    "UpstreamResponse",
    "check_declared_body",
    "configure",
    "decode_body",
    "dropped_headers",
    "error_event",
    "head_refusals",
    "inspect_head",
    "max_model_len_of",
    "protocol_with",
    "raise_nofile_limit",
    "read_body",
    "response_headers",
    "serves_vllm",
    "upstream_kind_of",
    "usable_request_id",
]
