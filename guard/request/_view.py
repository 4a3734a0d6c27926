"""The view the checks read of one request: the parsed body and a few facts about it, built
once (:class:`RequestView`), and what a path serves (:data:`Endpoint`).

A :class:`RequestView` is immutable at its own level; its ``body`` is the parsed JSON, shared and
never modified (checks return mutations as data instead). The caller's key comes resolved (by
:func:`guard.routing.resolve_key`, before the body is parsed): the view keeps its tenant and id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Protocol

__all__ = [
    "ANONYMOUS_TENANT",
    "KEPT_HEADERS",
    "CallerKey",
    "Endpoint",
    "HeadersLike",
    "RequestView",
    "endpoint_of",
    "normalise_headers",
]

# The tenant of a request without an API key (a policy that lists no keys: every caller).
ANONYMOUS_TENANT = "anonymous"

# What a path serves. ``pooling``: vLLM's /classify and /pooling (``input`` or ``messages``, as
# embeddings); ``score``: /score (pairs of ``text_1``/``text_2``, ``queries``/``documents``, ...);
# ``rerank``: /rerank (a ``query`` against ``documents``).
Endpoint = Literal[
    "chat",
    "completions",
    "embeddings",
    "pooling",
    "score",
    "rerank",
    "responses",
    "tokenize",
    "models",
    "other",
]

_ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/classify": "pooling",
    "/pooling": "pooling",
    "/score": "score",
    "/v1/score": "score",
    "/rerank": "rerank",
    "/v1/rerank": "rerank",
    "/v2/rerank": "rerank",
    "/v1/responses": "responses",
    "/tokenize": "tokenize",
    "/v1/tokenize": "tokenize",
    "/v1/models": "models",
}

# Headers a view keeps (lower case); everything else stays with the HTTP layer.
# `x-vllm-priority` (guard.http.PRIORITY_HEADER): the schema check decides the priority it asks.
KEPT_HEADERS = frozenset(
    {
        "content-type",
        "content-encoding",
        "content-length",
        "x-request-id",
        "user-agent",
        "x-vllm-priority",
    }
)
# Longest header value kept (a request id or user agent beyond this is cut, not trusted).
_MAX_KEPT_VALUE = 256

HeadersLike = Mapping[str, str] | Iterable[tuple[str | bytes, str | bytes]]


class CallerKey(Protocol):
    """What a view keeps of the caller's API key (a policy's ``KeyEntry``)."""

    @property
    def tenant(self) -> str: ...

    @property
    def key_id(self) -> str: ...

    @property
    def digest(self) -> str:
        """The key's SHA-256 hex digest, by which the policy finds its settings."""
        ...


def endpoint_of(path: str) -> Endpoint:
    """The endpoint a path serves (the query string ignored)."""
    return _ENDPOINTS.get(path.split("?", 1)[0], "other")


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def normalise_headers(headers: HeadersLike) -> list[tuple[str, str]]:
    """Header pairs with lower-case names, from a mapping or ASGI-style pairs."""
    items: Iterable[tuple[str | bytes, str | bytes]] = (
        headers.items() if isinstance(headers, Mapping) else headers
    )
    return [(_text(k).lower(), _text(v)) for k, v in items]


@dataclass(frozen=True, slots=True)
class RequestView:
    """One request as the checks see it.

    - ``body``: the parsed JSON (``None`` for an empty body); never modified;
    - ``path`` (no query string), ``endpoint`` (what the path serves), ``method``;
    - ``headers``: the :data:`KEPT_HEADERS` present, lower-case names, values cut to 256;
    - ``key``: the caller's API key as the policy lists it (``None``: anonymous);
      ``tenant``: its tenant (``anonymous`` without keys); ``key_id``: a short non-secret id;
    - ``raw_size``: the body's size in bytes as received.
    """

    body: Any
    path: str
    endpoint: Endpoint
    method: str = "POST"
    headers: Mapping[str, str] = field(default_factory=dict)
    key: CallerKey | None = None
    tenant: str = ANONYMOUS_TENANT
    raw_size: int = 0

    @property
    def key_id(self) -> str | None:
        return None if self.key is None else self.key.key_id

    @property
    def obj(self) -> dict[str, Any] | None:
        """The body when it is a JSON object (else ``None``)."""
        return self.body if isinstance(self.body, dict) else None

    @classmethod
    def build(
        cls,
        body: Any,
        *,
        path: str,
        method: str = "POST",
        headers: HeadersLike = (),
        key: CallerKey | None = None,
        raw_size: int = 0,
    ) -> RequestView:
        """A view; ``key`` as resolved by :func:`guard.routing.resolve_key`."""
        pairs = normalise_headers(headers)
        kept = {k: v[:_MAX_KEPT_VALUE] for k, v in pairs if k in KEPT_HEADERS}
        clean_path = path.split("?", 1)[0]
        return cls(
            body=body,
            path=clean_path,
            endpoint=endpoint_of(clean_path),
            method=method.upper(),
            headers=MappingProxyType(kept),
            key=key,
            tenant=ANONYMOUS_TENANT if key is None else key.tenant,
            raw_size=raw_size,
        )
