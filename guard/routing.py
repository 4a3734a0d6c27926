"""The front half's reading of a request's head: the route it is proxied as, the one method
that route accepts, the path and query sent upstream, and the caller's API key.

All of it is settled before the body is read, so a request for a path the guard does not proxy
or with an unknown key costs no parsing. The view of the body the checks read is
:class:`guard.request.RequestView`.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Container, Iterable
from urllib.parse import quote

from guard.errors import GuardError, NotFound
from guard.policy import KeyEntry, Policy, key_digest
from guard.request import HeadersLike, normalise_headers

__all__ = [
    "MAX_MODEL_ID_BYTES",
    "MODEL_ROUTE",
    "invalid_path",
    "method_of",
    "resolve_key",
    "route_not_allowed",
    "route_of",
    "upstream_query",
    "upstream_target",
]

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
