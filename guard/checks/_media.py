"""Inline media read the way the upstreams' decoders will read it, a few bytes at a time.

A tiny compressed image can declare huge dimensions (a 50 KB PNG of 20000 x 20000 pixels
decodes to 1.2 GB). The header says so, and only the bytes read are decoded (base64 maps 3 bytes
to 4 characters, so any byte range is a character range): a few dozen small decodes, however
large the image.

vLLM hands every image payload to Pillow with 36 formats allowed, whatever MIME type the data
URL declares, and Pillow tries them in order, moving on when one refuses the bytes. So the
format is sniffed from the bytes, the header is walked the way Pillow 13 walks it (every PNG
``IHDR`` before ``IDAT``, every JPEG ``SOF`` before ``SOS`` with 8-bit samples, a GIF's first
frame beyond its logical screen, BMP's unsigned width and flipped height), and anything else
gives ``None`` (the check refuses it: fail closed). Formats sized: PNG, JPEG, GIF, BMP, WebP.
Bytes that a Pillow reader without a magic number could also take (IM, IMT, GBR, FLI, SPIDER:
each reads its own width and height from the same bytes) are ambiguous and give ``None`` too.

Base64 must be plain (:func:`is_strict_base64`): vLLM decodes with ``validate=True`` (no
whitespace, no URL-safe alphabet, padding required) while llama-cpp-python drops anything
outside the alphabet, so only text both read the same way is sized.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from dataclasses import dataclass

__all__ = ["ImageHeader", "image_size", "is_strict_base64", "sniff_image"]

_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
# JPEG markers Pillow knows (anything else stops its reader), those it reads without a length,
# and those that set the size (its SOF handler: SOF0-3, 5-7, 9-11, 13-15 and DHP).
_JPEG_NO_LENGTH = frozenset({0xC8, *range(0xD0, 0xDA), *range(0xF0, 0xFE)})
_JPEG_SOF = frozenset({*range(0xC0, 0xC4), 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_JPEG_SOF_ALL = _JPEG_SOF | {0xDE}
_JPEG_SOS = 0xDA
# Chunks, segments or blocks walked before giving up (real files have under 20 before the data).
_MAX_HOPS = 256
# Pillow's IM reader: every header line is "Key: value".
_IM_LINE = re.compile(rb"^([A-Z][^:]*):[ \t]*(.*)[ \t]*$")
_IMT_LINE = re.compile(rb"([a-z]*) ([^ \r\n]*)")


def is_strict_base64(text: str, start: int = 0, end: int | None = None) -> bool:
    """Whether ``text[start:end]`` is base64 as a validating decoder reads it: the standard
    alphabet, a length that is a multiple of 4, and at most two ``=`` at the very end."""
    chunk = text[start:end]
    if len(chunk) % 4 or not chunk.isascii():
        return False
    rest = chunk.encode("ascii").translate(None, _ALPHABET)  # in C, at memory speed
    return not rest or (rest in (b"=", b"==") and chunk.endswith(rest.decode()))


class _Base64Bytes:
    """Random access to the bytes of base64 text ``text[start:end]`` without decoding it all."""

    def __init__(self, text: str, start: int, end: int) -> None:
        self.text = text
        self.start = start
        self.end = end
        self.size = (end - start) // 4 * 3
        if end > start and text[end - 1] == "=":
            self.size -= 2 if text[end - 2] == "=" else 1

    def read(self, pos: int, n: int) -> bytes | None:
        if pos < 0 or n <= 0 or pos + n > self.size:
            return None
        first = pos // 3
        last = (pos + n + 2) // 3
        chunk = self.text[self.start + 4 * first : self.start + 4 * last]
        try:
            data = base64.b64decode(chunk, validate=True)
        except (binascii.Error, ValueError):
            return None
        offset = pos - 3 * first
        out = data[offset : offset + n]
        return out if len(out) == n else None

    def head(self, n: int) -> bytes:
        """Up to the first ``n`` bytes (fewer when the data is shorter)."""
        return self.read(0, min(n, self.size)) or b""


@dataclass(frozen=True, slots=True)
class ImageHeader:
    """An image's format and the size Pillow will give it."""

    format: str
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def sniff_image(text: str, start: int, end: int) -> ImageHeader | None:
    """The format and size of the image whose base64 is ``text[start:end]``, as Pillow reads
    them; None when it is not a format sized here, malformed, or ambiguous (module docstring)."""
    data = _Base64Bytes(text, start, end)
    head = data.head(128)
    if len(head) < 12 or _ambiguous(head):
        return None
    size: tuple[int, int] | None = None
    kind = ""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        kind, size = "png", _png(data)
    elif head[:3] == b"\xff\xd8\xff":
        kind, size = "jpeg", _jpeg(data)
    elif head[:6] in (b"GIF87a", b"GIF89a"):
        kind, size = "gif", _gif(data, head)
    elif head[:2] == b"BM":
        kind, size = "bmp", _bmp(head)
    elif head[:4] == b"RIFF" and head[8:12] == b"WEBP" and len(head) >= 30:
        kind, size = "webp", _webp(head)
    if size is None:
        return None
    return ImageHeader(kind, size[0], size[1])


def image_size(text: str, start: int, end: int) -> tuple[int, int] | None:
    """(width, height) of the image whose base64 is ``text[start:end]``, or None."""
    header = sniff_image(text, start, end)
    return None if header is None else (header.width, header.height)


# -- formats --------------------------------------------------------------------------------------


def _png(data: _Base64Bytes) -> tuple[int, int] | None:
    """The largest IHDR before IDAT (Pillow lets a later IHDR override the size)."""
    pos = 8
    width = height = 0
    for _ in range(_MAX_HOPS):
        chunk = data.read(pos, 8)
        if chunk is None:  # the data ends: the size is what was read
            return (width, height) if width else None
        length, kind = struct.unpack(">I4s", chunk)
        if kind == b"IHDR":
            dims = data.read(pos + 8, 8)
            if dims is None:
                return None
            w, h = struct.unpack(">II", dims)
            width, height = max(width, w), max(height, h)
        elif kind == b"IDAT" or kind == b"IEND":
            return (width, height) if width else None
        elif not width:
            return None  # Pillow needs IHDR first
        pos += 12 + length
    return None


def _jpeg(data: _Base64Bytes) -> tuple[int, int] | None:
    """The largest SOF before SOS, each with 8-bit samples (Pillow's reader refuses others and
    lets a later SOF override the size)."""
    pos = 2
    width = height = 0
    for _ in range(_MAX_HOPS):
        marker = data.read(pos, 2)
        if marker is None or marker[0] != 0xFF:
            return None  # junk between segments (Pillow skips it; refused here)
        kind = marker[1]
        if kind == 0xFF:  # fill byte
            pos += 1
            continue
        if kind in _JPEG_NO_LENGTH:
            pos += 2
            continue
        if kind == _JPEG_SOS:
            return (width, height) if width else None
        if kind not in _JPEG_SOF_ALL and not (0xC4 <= kind <= 0xFE):
            return None  # not a marker Pillow knows
        raw = data.read(pos + 2, 2)
        if raw is None:
            return None
        length = raw[0] << 8 | raw[1]
        if length < 2:
            return None
        if kind in _JPEG_SOF_ALL:
            frame = data.read(pos + 4, 5)
            if frame is None or frame[0] != 8:
                return None
            h, w = struct.unpack(">HH", frame[1:5])
            width, height = max(width, w), max(height, h)
        pos += 2 + length
    return None


def _gif(data: _Base64Bytes, head: bytes) -> tuple[int, int] | None:
    """The logical screen, grown to the first frame's extent as Pillow grows it."""
    width, height = struct.unpack("<HH", head[6:10])
    flags = head[10]
    pos = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    for _ in range(_MAX_HOPS):
        block = data.read(pos, 1)
        if block is None:
            return None
        if block == b",":
            desc = data.read(pos + 1, 8)
            if desc is None:
                return None
            x0, y0, w, h = struct.unpack("<HHHH", desc)
            return max(width, x0 + w), max(height, y0 + h)
        if block != b"!":
            return None  # the trailer or junk before any frame: Pillow fails
        pos += 2  # introducer and label, then sub-blocks up to an empty one
        for _ in range(_MAX_HOPS):
            size = data.read(pos, 1)
            if size is None:
                return None
            pos += 1 + size[0]
            if size[0] == 0:
                break
        else:
            return None
    return None


def _bmp(head: bytes) -> tuple[int, int] | None:
    header_size = struct.unpack("<I", head[14:18])[0]
    if header_size == 12:
        width, height = struct.unpack("<HH", head[18:22])
        return width, height
    if header_size in (40, 52, 56, 64, 108, 124) and len(head) >= 26:
        width, raw_height = struct.unpack("<II", head[18:26])
        height = 2**32 - raw_height if head[25] == 0xFF else raw_height
        return width, height
    return None


def _webp(head: bytes) -> tuple[int, int] | None:
    kind = head[12:16]
    if kind == b"VP8 ":
        width, height = struct.unpack("<HH", head[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if kind == b"VP8L":
        b = head[21:25]
        width = 1 + (b[0] | (b[1] & 0x3F) << 8)
        height = 1 + (b[1] >> 6 | b[2] << 2 | (b[3] & 0x0F) << 10)
        return width, height
    if kind == b"VP8X":
        width = 1 + int.from_bytes(head[24:27], "little")
        height = 1 + int.from_bytes(head[27:30], "little")
        return width, height
    return None


# -- readers without a magic number ---------------------------------------------------------------


def _ambiguous(head: bytes) -> bool:
    """Whether a Pillow reader that vLLM allows could take these bytes as its own format (with
    its own width and height): AVIF's, GBR's and FLI's accept tests, SPIDER's header test, and
    IM's and IMT's first text line."""
    if head[4:8] == b"ftyp":
        return True  # AVIF (tried first)
    gbr = struct.unpack(">II", head[:8])
    if gbr[0] >= 20 and gbr[1] in (1, 2):
        return True  # GBR
    fli = struct.unpack("<HH", head[4:6] + head[14:16])
    if fli[0] in (0xAF11, 0xAF12) and fli[1] in (0, 3):
        return True  # FLI
    if len(head) >= 108 and (_spider(head, ">") or _spider(head, "<")):
        return True
    return _text_header(head)


def _is_int(f: float) -> bool:
    try:
        return f - int(f) == 0
    except (ValueError, OverflowError):
        return False


def _spider(head: bytes, order: str) -> bool:
    """Pillow's ``isSpiderHeader`` on the first 27 floats."""
    h = (99.0, *struct.unpack(order + "27f", head[:108]))
    if not all(_is_int(h[i]) for i in (1, 2, 5, 12, 13, 22, 23)):
        return False
    if int(h[5]) not in (1, 3, -11, -12, -21, -22):
        return False
    return int(h[22]) == int(h[13]) * int(h[23])


def _text_header(head: bytes) -> bool:
    """IM and IMT read a text header when a line feed is in the first 100 bytes."""
    if b"\n" not in head[:100]:
        return False
    text = head.lstrip(b"\r")
    line = text.split(b"\n", 1)[0]
    if line.endswith(b"\r"):
        line = line[:-1]
    if text[:1] not in (b"\x00", b"\x1a") and _IM_LINE.match(line):
        return True  # IM
    return bool(text[:1] == b"*" or _IMT_LINE.match(line))  # IMT
