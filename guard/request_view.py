"""What the checks see of one request: its route, its caller's key, and a :class:`RequestView`
of the parsed body with a few facts about it, built once.

A :class:`RequestView` is immutable at its own level; its ``body`` is the parsed JSON, shared and
never modified (checks return mutations as data instead). The caller's API key is resolved to a
tenant (:func:`resolve_key`) before the body is parsed, so an unknown key costs no parsing.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal
from urllib.parse import quote

from guard.errors import GuardError, NotFound
from guard.policy._models import ANONYMOUS_TENANT, KeyEntry, Policy, key_digest

__all__ = [
    "KEPT_HEADERS",
    "MODEL_ROUTE",
    "Endpoint",
    "HeadersLike",
    "RequestView",
    "endpoint_of",
    "invalid_path",
    "method_of",
    "normalise_headers",
    "resolve_key",
    "route_not_allowed",
    "route_of",
    "upstream_query",
    "upstream_target",
]

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
KEPT_HEADERS = frozenset(
    {"content-type", "content-encoding", "content-length", "x-request-id", "user-agent"}
)
# Longest header value kept (a request id or user agent beyond this is cut, not trusted).
_MAX_KEPT_VALUE = 256

HeadersLike = Mapping[str, str] | Iterable[tuple[str | bytes, str | bytes]]


# The route label of /v1/models/<id> (the one proxied path that is a pattern).
MODEL_ROUTE = "/v1/models/{model}"
_GET_ROUTES = frozenset({"/v1/models", MODEL_ROUTE})


def route_of(path: str, routes: Container[str]) -> str | None:
    """The route a path is proxied as (``routes``: the policy's ``allowed_routes``): the path
    itself, or :data:`MODEL_ROUTE`; None when the guard does not proxy it."""
    if path in routes:
        return path
    if path.startswith("/v1/models/") and len(path) > 11:
        return MODEL_ROUTE
    return None


# A model id in /v1/models/<id>: at most this many UTF-8 bytes (Hugging Face ids are under 100).
MAX_MODEL_ID_BYTES = 256
# Kept as they are when the id is percent-encoded again for the upstream (RFC 3986 pchar and /).
_ID_SAFE = "/!$&'()*+,;=:@-._~"
# Control characters (C0, DEL, C1) and U+FFFD, which is what an invalid UTF-8 escape decodes to.
_UNSENDABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\ufffd\\]")


def invalid_path(message: str) -> GuardError:
    return GuardError("invalid_path", message, param="path")


def upstream_target(route: str, path: str) -> str:
    """The path sent upstream for a request to ``path`` (decoded, as the ASGI scope has it),
    proxied as ``route``; :func:`invalid_path` (400) when the client's path cannot be sent as the
    guard judged it. A fixed route is sent as the route itself. A model id is checked (no
    control characters, no invalid UTF-8 escapes, no backslash, no empty, ``.`` or ``..``
    segments that a normalising server would resolve to another route, at most
    :data:`MAX_MODEL_ID_BYTES`) and percent-encoded again, so that the upstream decodes the
    very id the guard saw, whatever the client's spelling (``%0d%0a``, ``%E2%82%AC``, ``%2e``).
    """
    if route != MODEL_ROUTE:
        return route
    model = path[len("/v1/models/") :]
    if len(model.encode("utf-8", "surrogatepass")) > MAX_MODEL_ID_BYTES:
        raise invalid_path(f"the model id is longer than {MAX_MODEL_ID_BYTES} bytes")
    if _UNSENDABLE.search(model):
        raise invalid_path(
            "the model id has control characters, a backslash or invalid UTF-8 escapes"
        )
    if any(segment in ("", ".", "..") for segment in model.split("/")):
        raise invalid_path("the model id has an empty, '.' or '..' path segment")
    try:
        encoded = quote(model, safe=_ID_SAFE, encoding="utf-8", errors="strict")
    except UnicodeEncodeError:  # a lone surrogate
        raise invalid_path("the model id is not valid Unicode") from None
    return "/v1/models/" + encoded


def upstream_query(query: bytes) -> str:
    """The query string sent upstream: the client's bytes as they are when they are printable
    ASCII without spaces (what an HTTP/1.1 request target may hold; httptools refuses the rest
    before the app sees it, another ASGI server might not); else :func:`invalid_path`."""
    if not query:
        return ""
    if not (query.isascii() and query.translate(None, _TARGET_BYTES) == b""):
        raise invalid_path("the query string has bytes a request target may not hold")
    return query.decode("ascii")


_TARGET_BYTES = bytes(range(0x21, 0x7F))


def method_of(route: str) -> str:
    """The one method a route accepts."""
    return "GET" if route in _GET_ROUTES else "POST"


def route_not_allowed(routes: Iterable[str]) -> NotFound:
    return NotFound(
        "route_not_allowed",
        "this path is not proxied by the guard; allowed: " + ", ".join(sorted(routes)),
    )


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


def _bearer(pairs: list[tuple[str, str]]) -> str | None:
    """The bearer token, or None when absent; refuses ambiguous or malformed credentials."""
    values = [v for k, v in pairs if k == "authorization"]
    if not values:
        return None
    if len(values) > 1:
        raise GuardError(
            "invalid_api_key", "send one Authorization header", param="authorization", status=401
        )
    scheme, _, token = values[0].strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise GuardError(
            "invalid_api_key",
            "the Authorization header must be 'Bearer <key>'",
            param="authorization",
            status=401,
        )
    return token


def resolve_key(headers: HeadersLike, policy: Policy) -> KeyEntry | None:
    """The policy's entry for the request's bearer key; ``None`` when the policy lists no keys
    (every caller is the anonymous tenant). Raises 401 ``missing_api_key`` / ``invalid_api_key``.
    """
    if not policy.keys:
        return None
    token = _bearer(normalise_headers(headers))
    if token is None:
        raise GuardError(
            "missing_api_key",
            "an API key is required: send 'Authorization: Bearer <key>'",
            status=401,
        )
    digest = key_digest(token)
    entry = policy.keys_by_digest.get(digest)
    # The dict lookup is on a digest, so its timing says nothing about the key; compare again
    # in constant time anyway, as a matter of form.
    if entry is None or not hmac.compare_digest(entry.digest, digest):
        raise GuardError("invalid_api_key", "the API key is not valid", status=401)
    return entry


@dataclass(frozen=True, slots=True)
class RequestView:
    """One request as the checks see it.

    - ``body``: the parsed JSON (``None`` for an empty body); never modified;
    - ``path`` (no query string), ``endpoint`` (what the path serves), ``method``;
    - ``headers``: the :data:`KEPT_HEADERS` present, lower-case names, values cut to 256;
    - ``key``: the policy's entry for the caller's API key (``None``: anonymous);
      ``tenant``: its tenant (``anonymous`` without keys); ``key_id``: a short non-secret id;
    - ``raw_size``: the body's size in bytes as received.
    """

    body: Any
    path: str
    endpoint: Endpoint
    method: str = "POST"
    headers: Mapping[str, str] = field(default_factory=dict)
    key: KeyEntry | None = None
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
        key: KeyEntry | None = None,
        raw_size: int = 0,
    ) -> RequestView:
        """A view; ``key`` as resolved by :func:`resolve_key`."""
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
