"""Headless Chromium (Debian's ``chromium`` package) for the report tests: screenshots, the DOM
after scripts ran, the console's messages, and a small PNG reader (no Pillow here).

.ci/run installs ``chromium`` when it is missing; a test that needs it skips without it,
except under CI (``CI=true``), where a missing browser is a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = [
    "Png",
    "chromium",
    "console_messages",
    "dump_dom",
    "read_png",
    "require_chromium",
    "screenshot",
]

_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
_CONSOLE = re.compile(r":CONSOLE:\d+\] (.*)")


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def require_chromium() -> str:
    path = chromium()
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed (.ci/run installs it from Debian)")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    return path


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    binary = require_chromium()
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        return subprocess.run(
            [
                binary,
                *_FLAGS,
                f"--user-data-dir={profile}",
                "--enable-logging=stderr",
                "--v=0",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )


def console_messages(stderr: str) -> list[str]:
    """What the page wrote to its console (script errors included: ``Uncaught ...``)."""
    return [m.group(1) for m in _CONSOLE.finditer(stderr)]


def screenshot(
    url: str, png: Path, width: int = 1400, height: int = 3000, timeout_s: float = 90
) -> list[str]:
    """Write ``url``'s screenshot to ``png``; returns the console messages."""
    proc = _run(
        [f"--screenshot={png}", f"--window-size={width},{height}", url], timeout_s=timeout_s
    )
    assert png.is_file(), f"no screenshot (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return console_messages(proc.stderr)


def dump_dom(url: str, budget_ms: int = 3000, timeout_s: float = 90) -> tuple[str, list[str]]:
    """The DOM after the page's scripts ran for ``budget_ms`` of virtual time, and the
    console messages."""
    proc = _run(
        [f"--virtual-time-budget={budget_ms}", "--window-size=1400,3000", "--dump-dom", url],
        timeout_s=timeout_s,
    )
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-2000:]
    return proc.stdout, console_messages(proc.stderr)


@dataclass
class Png:
    width: int
    height: int
    channels: int
    rows: list[bytes]

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        i = x * self.channels
        r, g, b = self.rows[y][i : i + 3]
        return r, g, b

    def pixels(self, y0: int = 0, y1: int | None = None, step: int = 1) -> list[tuple[int, ...]]:
        """RGB of every ``step``-th pixel of rows ``y0``..``y1``."""
        out: list[tuple[int, ...]] = []
        c = self.channels
        for y in range(y0, self.height if y1 is None else min(y1, self.height), step):
            row = self.rows[y]
            out += [tuple(row[i : i + 3]) for i in range(0, len(row), c * step)]
        return out


def read_png(path: Path) -> Png:
    """An 8-bit RGB(A), non-interlaced PNG (what Chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    width = height = channels = 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0 and colour in (2, 6), (depth, colour, interlace)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    prev = bytearray(stride)
    i = 0
    for _ in range(height):
        kind_ = raw[i]
        line = bytearray(raw[i + 1 : i + 1 + stride])
        i += 1 + stride
        _unfilter(kind_, line, prev, channels)
        rows.append(bytes(line))
        prev = line
    return Png(width, height, channels, rows)


def _unfilter(kind: int, line: bytearray, prev: bytearray, bpp: int) -> None:
    if kind == 0:
        return
    if kind == 2:
        line[:] = bytes((a + b) & 255 for a, b in zip(line, prev, strict=True))
        return
    for x in range(len(line)):
        a = line[x - bpp] if x >= bpp else 0
        b = prev[x]
        if kind == 1:
            line[x] = (line[x] + a) & 255
        elif kind == 3:
            line[x] = (line[x] + ((a + b) >> 1)) & 255
        elif kind == 4:
            c = prev[x - bpp] if x >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        else:
            raise ValueError(f"PNG filter {kind}")
