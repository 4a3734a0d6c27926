"""Small well-formed image files (headers as Pillow reads them), built without Pillow."""

from __future__ import annotations

import base64
import struct
import zlib


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width: int, height: int, *, extra_ihdr: tuple[int, int] | None = None) -> bytes:
    """A PNG declaring width x height (one tiny IDAT: decoders fail on the data, not the header).
    ``extra_ihdr``: a second IHDR before IDAT (Pillow lets it override the size)."""
    ihdr = _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    out = b"\x89PNG\r\n\x1a\n" + ihdr
    if extra_ihdr is not None:
        out += _png_chunk(b"IHDR", struct.pack(">IIBBBBB", *extra_ihdr, 8, 2, 0, 0, 0))
    return out + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + _png_chunk(b"IEND", b"")


def gif(width: int, height: int, *, frame: tuple[int, int, int, int] | None = None) -> bytes:
    """A GIF89a with a logical screen of width x height and one frame (x, y, w, h)."""
    x, y, w, h = frame if frame is not None else (0, 0, width, height)
    screen = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\x00" * 6
    comment = b"!\xfe\x05hello\x00"
    descriptor = b"," + struct.pack("<HHHHB", x, y, w, h, 0)
    return screen + comment + descriptor + b"\x02\x02\x44\x01\x00;"


def bmp(width: int, height: int, *, raw_height: int | None = None) -> bytes:
    """A BITMAPINFOHEADER BMP (bottom-up); ``raw_height``: the height field as stored."""
    stored = raw_height if raw_height is not None else height
    dib = struct.pack("<IIIHHIIIIII", 40, width, stored, 1, 24, 0, 0, 2835, 2835, 0, 0)
    pixels = b"\x00" * 16
    header = b"BM" + struct.pack("<IHHI", 14 + len(dib) + len(pixels), 0, 0, 14 + len(dib))
    return header + dib + pixels


def jpeg(
    width: int, height: int, *, app_bytes: int = 20, second_sof: tuple[int, int] | None = None
) -> bytes:
    """A baseline JPEG header up to its scan; ``second_sof``: another SOF (w, h) before SOS."""
    app = b"\xff\xe1" + struct.pack(">H", app_bytes + 2) + b"E" * app_bytes
    dqt = b"\xff\xdb" + struct.pack(">H", 67) + b"\x00" + b"\x01" * 64

    def sof(w: int, h: int) -> bytes:
        return b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, h, w, 3) + b"\x01\x11\x00" * 3

    frames = sof(width, height) + (sof(*second_sof) if second_sof else b"")
    sos = b"\xff\xda" + struct.pack(">HB", 12, 3) + b"\x01\x00\x02\x11\x03\x11" + b"\x00\x3f\x00"
    return b"\xff\xd8" + app + dqt + frames + sos + b"\x00" * 8 + b"\xff\xd9"


def webp_vp8x(width: int, height: int) -> bytes:
    body = b"VP8X" + struct.pack("<I", 10) + b"\x00" * 4
    body += (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body + b"\x00" * 8


def webp_vp8l(width: int, height: int) -> bytes:
    w, h = width - 1, height - 1
    bits = w | (h << 14)
    body = b"VP8L" + struct.pack("<I", 5) + b"\x2f" + bits.to_bytes(4, "little")
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body + b"\x00" * 8


def webp_vp8(width: int, height: int) -> bytes:
    frame = b"\x00\x00\x00" + b"\x9d\x01\x2a" + struct.pack("<HH", width, height)
    body = b"VP8 " + struct.pack("<I", len(frame)) + frame
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body + b"\x00" * 8


MAKERS = {
    "png": png,
    "gif": gif,
    "bmp": bmp,
    "jpeg": jpeg,
    "webp_vp8x": webp_vp8x,
    "webp_vp8l": webp_vp8l,
    "webp_vp8": webp_vp8,
}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(media_type: str, payload: bytes) -> str:
    return f"data:{media_type};base64," + b64(payload)
