"""HTTP framing limits, enforced at the ASGI level before anything else looks at a request.

``inspect_head(headers, limits)`` walks the raw header list once: it caps the number of headers
and their total size (431) and picks out what the guard needs (``content-length``,
``content-encoding``, ``authorization``, ``x-request-id``). ``read_body(receive, head, limits)``
then reads the body straight from the ASGI ``receive`` channel rather than letting Starlette
buffer it:

- a declared ``Content-Length`` above the cap is refused before one byte is read, and a chunked
  (or lying) body is refused as soon as the bytes received cross the cap: ``body_too_large``
  (413) either way, so no body bigger than the cap is ever held;
- the whole body must arrive within ``body_read_timeout_s`` (a slow-loris sender gets 408
  ``body_timeout``);
- ``Content-Encoding`` is refused (415 ``unsupported_content_encoding``) or, when the policy
  allows it, ``gzip``/``deflate`` are inflated as they arrive, in bounded steps, under an output
  cap (``decompressed_body_too_large``) and a ratio cap (``compression_ratio_exceeded``), so a
  compression bomb costs at most the cap. Stacked encodings (``gzip, gzip``) are always refused.

A refusal mid-body first reads and discards up to ``linger_bytes`` more (nothing is kept), so a
client that writes its whole body before reading its answer still gets the 413 rather than a
reset; a refusal that leaves more unread carries ``connection: close``, so the server drops the
connection instead of draining an attacker-sized body to reach the next request.

uvicorn's httptools parser has no header-size limit of its own (h11 has 16 KiB by default), so
the caps here are the ones a client meets.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import pydantic
import pydantic.dataclasses
from pydantic import Field
from starlette.types import Receive

from guard._limits import LIMITS_CONFIG, PosFloat, PosInt
from guard.errors import ClientDisconnected, GuardError, LimitExceeded

__all__ = [
    "FramingLimits",
    "RequestHead",
    "check_declared_body",
    "decode_body",
    "inspect_head",
    "read_body",
    "usable_request_id",
]

EncodingPolicy = Literal["refuse", "inflate"]

_CLOSE = {"connection": "close"}
# zlib window bits: gzip container, zlib container (HTTP's "deflate").
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
# Inflate in steps of at most this much output, so one small input chunk cannot expand at once.
_INFLATE_STEP = 64 << 10
# Request ids longer than this (or not printable ASCII) are replaced, not echoed.
MAX_REQUEST_ID_BYTES = 128
# The inflate ratio is not checked below this much output (small repetitive JSON is fine).
RATIO_FLOOR_BYTES = 64 << 10
# After a refusal, this much more body is read and discarded so that a client that writes its
# whole body before reading still gets the answer (nginx's lingering close); beyond it the
# connection is closed unread.
LINGER_BYTES = 1 << 20


@pydantic.dataclasses.dataclass(frozen=True, config=LIMITS_CONFIG)
class FramingLimits:
    """Limits on the HTTP framing of one request: the policy's ``limits.body`` section.

    ``max_body_bytes`` counts bytes on the wire (compressed, if encoded); ``max_header_bytes``
    counts names + values + 4 bytes of separators per header. The inflate ratio is checked once
    the output exceeds ``RATIO_FLOOR_BYTES``, so small bodies of repetitive JSON still pass.
    """

    max_body_bytes: PosInt = Field(
        default=4 * 1_048_576,
        description="Largest request body in bytes, counted while reading (413 before the "
        "rest is read). 4 MiB holds a 2048-token prompt many times over and a few base64 "
        "images; raise it with `limits.json.max_string_bytes` for larger media.",
    )
    max_header_count: PosInt = Field(
        default=100,
        description="Most request headers (HTTP clients send about 10 to 20; Go and nginx "
        "accept about 100).",
    )
    max_header_bytes: PosInt = Field(
        default=16_384,
        description="Most bytes of all request headers together (Node.js's default; one "
        "8 MB header is a known attack, vLLM GHSA-rxc4-3w6r-4v47).",
    )
    body_read_timeout_s: PosFloat = Field(
        default=10.0,
        description="Seconds allowed to receive the whole body (a slow body then gets 408).",
    )
    content_encoding: EncodingPolicy = Field(
        default="refuse",
        description="`refuse`: a compressed body (`Content-Encoding` other than `identity`) "
        "gets 415. `inflate`: gzip and deflate bodies are inflated under "
        "`max_inflated_bytes` and `max_inflate_ratio`, and the inflated body is checked.",
    )
    max_inflated_bytes: PosInt = Field(
        default=4 * 1_048_576,
        description="With `inflate`: largest body after inflating (413 beyond it; inflating "
        "stops there, so a gzip bomb costs at most this much).",
    )
    max_inflate_ratio: PosFloat = Field(
        default=32.0,
        description="With `inflate`: largest ratio of inflated to compressed size (JSON "
        "compresses 5 to 10 times; bombs 1000 times).",
    )

    @pydantic.field_validator("max_inflate_ratio")
    @classmethod
    def _not_below_one(cls, value: float) -> float:
        if value < 1:  # after the > 0 check, so that 0 reads as every other bound does
            raise ValueError("must be >= 1")
        return value

    @property
    def largest_body(self) -> int:
        """The largest body :func:`read_body` returns (decoded)."""
        if self.content_encoding == "inflate":
            return max(self.max_body_bytes, self.max_inflated_bytes)
        return self.max_body_bytes


@dataclass(frozen=True)
class RequestHead:
    """What the guard reads from the request headers (one pass, see :func:`inspect_head`)."""

    content_length: int | None
    content_encoding: str | None  # lower-cased; None for absent or identity
    authorization: str | None
    request_id: str | None  # the client's x-request-id if usable, else None
    content_type: str | None
    header_count: int
    header_bytes: int
    chunked: bool = False  # Transfer-Encoding: chunked (a body of unknown length follows)

    @property
    def has_body(self) -> bool:
        return bool(self.content_length) or self.chunked


def _too_large(code: str, message: str) -> LimitExceeded:
    return LimitExceeded(code, message, status=413)


def inspect_head(headers: Iterable[tuple[bytes, bytes]], limits: FramingLimits) -> RequestHead:
    """Count and size the headers (431 when over a cap) and extract the ones the guard uses."""
    count = 0
    size = 0
    content_length: int | None = None
    encoding: str | None = None
    authorization: str | None = None
    request_id: str | None = None
    content_type: str | None = None
    chunked = False
    for name, value in headers:
        count += 1
        size += len(name) + len(value) + 4
        if count > limits.max_header_count:
            raise LimitExceeded(
                "too_many_headers",
                f"the request has more than {limits.max_header_count} headers",
                status=431,
                headers=_CLOSE,
            )
        if size > limits.max_header_bytes:
            raise LimitExceeded(
                "headers_too_large",
                f"the request headers exceed {limits.max_header_bytes} bytes",
                status=431,
                headers=_CLOSE,
            )
        # ASGI servers lower-case header names.
        if name == b"content-length":
            content_length = _content_length(value, content_length)
        elif name == b"content-encoding":
            encoding = _merge_encoding(encoding, value)
        elif name == b"authorization":
            authorization = value.decode("latin-1")
        elif name == b"x-request-id":
            request_id = usable_request_id(value)
        elif name == b"content-type":
            content_type = value.decode("latin-1")
        elif name == b"transfer-encoding":
            chunked = chunked or b"chunked" in value.lower()
    if encoding == "identity":
        encoding = None
    return RequestHead(
        content_length, encoding, authorization, request_id, content_type, count, size, chunked
    )


def _content_length(value: bytes, previous: int | None) -> int:
    text = value.strip()
    # At most 19 digits: int() of a megabyte of digits is quadratic in CPython.
    if not text.isdigit() or len(text) > 19:
        raise GuardError("invalid_content_length", "Content-Length is not a decimal number")
    length = int(text)
    if previous is not None and previous != length:
        raise GuardError("invalid_content_length", "conflicting Content-Length headers")
    return length


def _merge_encoding(previous: str | None, value: bytes) -> str:
    text = value.decode("latin-1").strip().lower()
    if previous is not None and previous != "identity":
        text = f"{previous}, {text}"
    return text


def usable_request_id(value: bytes) -> str | None:
    """``value`` as a request id when it is short printable ASCII without spaces, else None."""
    # Echoed in responses and logs: only short printable ASCII without spaces.
    if not 0 < len(value) <= MAX_REQUEST_ID_BYTES:
        return None
    if not all(0x21 <= b <= 0x7E for b in value):
        return None
    return value.decode("ascii")


class _Inflater:
    """Streaming gzip/deflate decoder bounded in output size and ratio."""

    def __init__(self, encoding: str, limits: FramingLimits) -> None:
        self._d = zlib.decompressobj(_WBITS[encoding])
        self._limits = limits
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._in_bytes = 0

    def feed(self, data: bytes) -> None:
        self._in_bytes += len(data)
        try:
            while data:
                if self._d.eof:
                    # A second gzip member or trailing garbage: refused (not worth the ambiguity).
                    raise _bad_encoding("data after the end of the compressed body")
                room = self._limits.max_inflated_bytes - self._out_bytes + 1
                chunk = self._d.decompress(data, min(room, _INFLATE_STEP))
                self._take(chunk)
                data = self._d.unconsumed_tail
        except zlib.error as exc:
            raise _bad_encoding(f"the compressed body is invalid ({exc})") from None

    def finish(self) -> bytes:
        try:
            self._take(self._d.flush(_INFLATE_STEP))
        except zlib.error as exc:
            raise _bad_encoding(f"the compressed body is invalid ({exc})") from None
        if not self._d.eof:
            raise _bad_encoding("the compressed body is truncated")
        return b"".join(self._out)

    def _take(self, chunk: bytes) -> None:
        if not chunk:
            return
        self._out_bytes += len(chunk)
        limits = self._limits
        if self._out_bytes > limits.max_inflated_bytes:
            raise _too_large(
                "decompressed_body_too_large",
                f"the decompressed body exceeds {limits.max_inflated_bytes} bytes",
            )
        if self._out_bytes > RATIO_FLOOR_BYTES and self._out_bytes > limits.max_inflate_ratio * max(
            self._in_bytes, 1
        ):
            raise _too_large(
                "compression_ratio_exceeded",
                f"the body inflates more than {limits.max_inflate_ratio:g} times",
            )
        self._out.append(chunk)


def _bad_encoding(message: str) -> GuardError:
    return GuardError("invalid_content_encoding", message)


def _check_encoding(encoding: str | None, limits: FramingLimits) -> str | None:
    if encoding is None:
        return None
    if limits.content_encoding == "inflate" and encoding in _WBITS:
        return encoding
    allowed = "gzip or deflate" if limits.content_encoding == "inflate" else "none"
    raise GuardError(
        "unsupported_content_encoding",
        f"Content-Encoding {encoding[:40]!r} is not accepted (allowed: {allowed})",
        status=415,
    )


async def read_body(
    receive: Receive,
    head: RequestHead,
    limits: FramingLimits,
    *,
    linger_bytes: int = LINGER_BYTES,
) -> bytes:
    """Read the whole request body from ``receive`` under ``limits``; return it decoded.

    Raises :class:`GuardError` (413, 408, 415, 400) or :class:`ClientDisconnected`. After a
    refusal, up to ``linger_bytes`` more of the body are read and discarded (within the
    same deadline) so that a client that sends its whole body before reading sees the answer;
    a body bigger than that is left unread and the refusal carries ``connection: close``.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limits.body_read_timeout_s
    progress = _Progress()
    try:
        async with asyncio.timeout_at(deadline):
            return await _read(receive, head, limits, progress)
    except TimeoutError:
        raise GuardError(
            "body_timeout",
            f"the request body did not arrive within {limits.body_read_timeout_s:g} s",
            status=408,
            headers=_CLOSE,
        ) from None
    except ClientDisconnected:
        raise
    except GuardError as err:
        drained = progress.ended
        if not drained:
            try:
                async with asyncio.timeout_at(deadline):
                    drained = await _drain(
                        receive, head, limits.max_body_bytes + linger_bytes, progress
                    )
            except (TimeoutError, ClientDisconnected):
                drained = False
        if not drained:
            err.headers = {**err.headers, **_CLOSE}
        raise


class _Progress:
    __slots__ = ("ended", "received")

    def __init__(self) -> None:
        self.received = 0
        self.ended = False


class _BodyDecoder:
    """The body as it arrives, under the caps: size on the wire, then the encoding's."""

    __slots__ = ("_cap", "_inflater", "_parts", "progress")

    def __init__(self, head: RequestHead, limits: FramingLimits, progress: _Progress) -> None:
        encoding = check_declared_body(head, limits)
        self._cap = limits.max_body_bytes
        self._inflater = _Inflater(encoding, limits) if encoding is not None else None
        self._parts: list[bytes] = []
        self.progress = progress

    def feed(self, chunk: bytes) -> None:
        progress = self.progress
        progress.received += len(chunk)
        if progress.received > self._cap:
            raise _too_large("body_too_large", f"the request body exceeds {self._cap} bytes")
        if self._inflater is not None:
            self._inflater.feed(chunk)
        else:
            self._parts.append(chunk)

    def finish(self) -> bytes:
        if self._inflater is not None:
            return self._inflater.finish()
        parts = self._parts
        if not parts:
            return b""
        return parts[0] if len(parts) == 1 else b"".join(parts)


def check_declared_body(head: RequestHead, limits: FramingLimits) -> str | None:
    """What the head says of the body, checked before one byte of it is read: its
    ``Content-Encoding`` (415 unless inflated; returned) and declared length (413)."""
    encoding = _check_encoding(head.content_encoding, limits)
    cap = limits.max_body_bytes
    if head.content_length is not None and head.content_length > cap:
        raise _too_large("body_too_large", f"the request body exceeds {cap} bytes")
    return encoding


def decode_body(data: bytes, head: RequestHead, limits: FramingLimits) -> bytes:
    """A body that arrived whole (buffered by a proxy in front, Envoy's ext_proc): the same caps
    as :func:`read_body` (413 size, 415 encoding, inflated under its caps), returned decoded."""
    decoder = _BodyDecoder(head, limits, _Progress())
    if data:
        decoder.feed(data)
    return decoder.finish()


async def _read(
    receive: Receive, head: RequestHead, limits: FramingLimits, progress: _Progress
) -> bytes:
    decoder = _BodyDecoder(head, limits, progress)
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.disconnect":
            raise ClientDisconnected()
        if kind != "http.request":
            continue
        chunk: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        progress.ended = not more
        if chunk:
            decoder.feed(chunk)
        if not more:
            break
    return decoder.finish()


async def _drain(receive: Receive, head: RequestHead, budget: int, progress: _Progress) -> bool:
    """Read and discard the rest of the body if it ends within ``budget`` bytes in all."""
    if head.content_length is not None and head.content_length > budget:
        return False
    while progress.received <= budget:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False
        progress.received += len(message.get("body", b""))
        if not message.get("more_body", False):
            return progress.received <= budget
    return False
