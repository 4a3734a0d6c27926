"""The guard's image sniffer against the Pillow vLLM really uses (issue 13, media).

vLLM 0.32 opens every image payload with ``PIL.Image.open(..., formats=ALLOWED_IMAGE_FORMATS)``
and refuses it only over ``VLLM_MAX_IMAGE_PIXELS``. For the guard's pixel cap to hold, every
payload the guard sizes must open in that Pillow with at most the pixels the guard read.
Well-formed headers of each format, their crafted variants (a second IHDR or SOF, a GIF frame
past its screen, flipped BMP heights) and a few thousand seeded byte mutations of them are
sized by the guard here and opened by the vLLM venv's Pillow in a child process.
"""

from __future__ import annotations

import base64
import json
import random
import subprocess
from pathlib import Path

import pytest

from guard.checks._media import sniff_image
from tests.e2e.conftest import SCRIPT
from tests.guard.checks._images import MAKERS, bmp, gif, jpeg, png

_OPEN = """
import base64, io, json, sys
from PIL import Image
from vllm.multimodal.image import ALLOWED_IMAGE_FORMATS
Image.MAX_IMAGE_PIXELS = None
out = []
for item in json.load(sys.stdin):
    try:
        im = Image.open(io.BytesIO(base64.b64decode(item)), formats=ALLOWED_IMAGE_FORMATS)
        out.append([im.format, im.size[0], im.size[1]])
    except BaseException as exc:  # whatever Pillow raises, vLLM refuses the image
        out.append([type(exc).__name__])
print(json.dumps(out))
"""


def _vllm_python() -> Path:
    status = subprocess.run(
        ["python3", str(SCRIPT), "path", "vllm"], capture_output=True, text=True, check=False
    )
    root = Path(status.stdout.strip() or "/nonexistent")
    python = root / "venv" / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"the vllm upstream is not set up ({root})")
    return python


def _samples(n: int, seed: int) -> list[bytes]:
    base = [make(1234, 567) for make in MAKERS.values()]
    base += [
        png(8, 8, extra_ihdr=(3000, 3000)),
        jpeg(8, 8, second_sof=(3000, 4000)),
        gif(8, 8, frame=(2990, 10, 10, 2000)),
        bmp(8, 8, raw_height=2**32 - 8),
        bmp(8, 8, raw_height=0x80000000),
        jpeg(640, 480, app_bytes=5000),
    ]
    rnd = random.Random(seed)
    out = list(base)
    while len(out) < n:
        data = bytearray(rnd.choice(base))
        for _ in range(rnd.randint(1, 4)):
            pos = rnd.randrange(min(len(data), 96))
            data[pos] = rnd.randrange(256)
        out.append(bytes(data))
    return out


def test_every_image_the_guard_sizes_opens_no_larger_in_vllms_pillow() -> None:
    python = _vllm_python()
    samples = _samples(3000, seed=13)
    encoded = [base64.b64encode(s).decode() for s in samples]
    child = subprocess.run(
        [str(python), "-c", _OPEN],
        input=json.dumps(encoded),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    opened = json.loads(child.stdout.strip().splitlines()[-1])
    sized = 0
    for text, pil in zip(encoded, opened, strict=True):
        header = sniff_image(text, 0, len(text))
        if header is None:
            continue  # refused by the guard (fail closed)
        sized += 1
        if len(pil) == 1:
            continue  # Pillow refuses it: so does vLLM
        fmt, width, height = pil
        assert width * height <= header.pixels, (fmt, width, height, header, text[:80])
    assert sized > 500
