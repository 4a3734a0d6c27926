"""Image dimensions read from a base64 payload's header, decoding a few bytes at a time.

A tiny compressed image can declare huge dimensions (a 50 KB PNG of 20000 x 20000 pixels
decodes to 1.2 GB). The header says so: PNG, GIF, BMP and WebP at fixed offsets, JPEG in its
SOF segment, reached by hopping over the segments before it by their lengths. Only the bytes
read are decoded (base64 maps 3 bytes to 4 characters, so any byte range is a character range),
so this costs a few dozen small decodes, however large the image. Anything unrecognised, or
base64 that is not plain (whitespace, URL-safe alphabet), gives ``None``: not counted.
"""

from __future__ import annotations

import base64
import binascii
import struct

__all__ = ["image_size"]

# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic...), not DHT/JPG/DAC.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Segments hopped over before giving up (real files have under 20 before SOF).
_MAX_SEGMENTS = 256


class _Base64Bytes:
    """Random access to the bytes of base64 text ``text[start:end]`` without decoding it all."""

    def __init__(self, text: str, start: int, end: int) -> None:
        self.text = text
        self.start = start
        self.end = end
        self.size = (end - start) // 4 * 3

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


def image_size(text: str, start: int, end: int) -> tuple[int, int] | None:
    """(width, height) of the image whose base64 is ``text[start:end]``, or None."""
    data = _Base64Bytes(text, start, end)
    head = data.read(0, 30) or data.read(0, 12)
    if head is None:
        return None
    if head.startswith(b"\x89PNG\r\n\x1a\n") and len(head) >= 24:
        width, height = struct.unpack(">II", head[16:24])
        return width, height
    if head[:6] in (b"GIF87a", b"GIF89a"):
        width, height = struct.unpack("<HH", head[6:10])
        return width, height
    if head[:2] == b"BM" and len(head) >= 26:
        width, height = struct.unpack("<ii", head[18:26])
        return abs(width), abs(height)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP" and len(head) >= 30:
        return _webp(head)
    if head[:2] == b"\xff\xd8":
        return _jpeg(data)
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


def _jpeg(data: _Base64Bytes) -> tuple[int, int] | None:
    pos = 2
    for _ in range(_MAX_SEGMENTS):
        marker = data.read(pos, 4)
        if marker is None or marker[0] != 0xFF:
            return None
        kind = marker[1]
        if kind == 0xFF:  # fill byte
            pos += 1
            continue
        if kind in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            pos += 2
            continue
        length = marker[2] << 8 | marker[3]
        if kind in _SOF:
            frame = data.read(pos + 5, 4)
            if frame is None:
                return None
            height, width = struct.unpack(">HH", frame)
            return width, height
        if length < 2:
            return None
        pos += 2 + length
    return None
