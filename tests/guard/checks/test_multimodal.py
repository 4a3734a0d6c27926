"""guard.checks.multimodal: media parts, data-URL size, video frames, image dimensions."""

from __future__ import annotations

import base64
import struct
import time
import zlib
from typing import Any

import pytest

from guard.checks import CheckResult, check_multimodal
from guard.checks._media import image_size
from guard.errors import GuardError
from guard.policy import Policy, default_policy, policy_from_yaml
from guard.request_view import RequestView

P = default_policy()
M = P.limits.multimodal
CHAT = "/v1/chat/completions"


def run(body: Any, policy: Policy = P, path: str = CHAT) -> CheckResult:
    return check_multimodal(RequestView.build(body, path=path), policy)


def rejection(body: Any, policy: Policy = P) -> GuardError:
    result = run(body, policy)
    assert result.rejection is not None, "expected a rejection"
    return result.rejection


def with_parts(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, *parts]}]}


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def data_url(media_type: str, payload: bytes) -> str:
    return f"data:{media_type};base64," + base64.b64encode(payload).decode()


# -- image headers --------------------------------------------------------------------------------


def png(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", len(ihdr))
        + chunk
        + struct.pack(">I", zlib.crc32(chunk))
        + b"\x00" * 64
    )


def gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x00" * 32


def bmp(width: int, height: int) -> bytes:
    return b"BM" + b"\x00" * 16 + struct.pack("<ii", width, -height) + b"\x00" * 32


def jpeg(width: int, height: int, app_bytes: int = 20) -> bytes:
    app = b"\xff\xe1" + struct.pack(">H", app_bytes + 2) + b"E" * app_bytes
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\x00" * 9
    return b"\xff\xd8" + app + b"\xff\xdb\x00\x04\x00\x00" + sof + b"\xff\xd9"


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


@pytest.mark.parametrize("make", [png, gif, bmp, jpeg, webp_vp8x, webp_vp8l, webp_vp8])
def test_image_size_from_headers(make: Any) -> None:
    encoded = base64.b64encode(make(1234, 567)).decode()
    assert image_size(encoded, 0, len(encoded)) == (1234, 567)
    prefixed = "xyz," + encoded
    assert image_size(prefixed, 4, len(prefixed)) == (1234, 567)


def test_jpeg_sof_after_large_segments_is_found_by_hopping() -> None:
    data = jpeg(4000, 3000, app_bytes=60_000)
    big = data + b"\x00" * 500_000
    encoded = base64.b64encode(big).decode()
    start = time.perf_counter()
    assert image_size(encoded, 0, len(encoded)) == (4000, 3000)
    assert time.perf_counter() - start < 0.01


def test_unknown_or_broken_images_give_none() -> None:
    for payload in (b"hello world, not an image", b"\xff\xd8\xff"):
        encoded = base64.b64encode(payload).decode()
        assert image_size(encoded, 0, len(encoded)) is None
    assert image_size("!!!not base64!!!", 0, 16) is None
    assert image_size("", 0, 0) is None


# -- the check ------------------------------------------------------------------------------------


def test_image_pixels_at_and_over() -> None:
    side = int(M.max_image_pixels**0.5)
    assert side * side <= M.max_image_pixels
    ok = with_parts(image_part(data_url("image/png", png(side, side))))
    assert run(ok).rejection is None
    big = with_parts(image_part(data_url("image/png", png(side + 1, side + 1))))
    err = rejection(big)
    assert err.code == "image_too_large"
    assert err.param == "messages[0].content[1].image_url.url"
    bomb = with_parts(image_part(data_url("image/jpeg", jpeg(60000, 60000))))
    assert rejection(bomb).code == "image_too_large"


def test_media_part_count_at_and_over() -> None:
    part = image_part("https://example.com/cat.png")
    assert run(with_parts(*[part] * M.max_media_parts)).rejection is None
    result = run(with_parts(*[part] * M.max_media_parts))
    assert result.costs["media_parts"] == M.max_media_parts
    err = rejection(with_parts(*[part] * (M.max_media_parts + 1)))
    assert err.code == "media_parts_exceeded"


def test_media_parts_count_across_messages_and_kinds() -> None:
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    video = {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}}
    half = M.max_media_parts // 2
    body = {
        "messages": [
            {"role": "user", "content": [audio] * half},
            {"role": "user", "content": [video] * (half + 1)},
        ]
    }
    assert rejection(body).code == "media_parts_exceeded"


def test_data_url_size_at_and_over() -> None:
    prefix = "data:image/png;base64,"
    at = prefix + "A" * (M.max_data_url_bytes - len(prefix))
    assert run(with_parts(image_part(at))).rejection is None
    err = rejection(with_parts(image_part(at + "A")))
    assert err.code == "data_url_too_large"
    audio = {"type": "input_audio", "input_audio": {"data": "A" * (M.max_data_url_bytes + 1)}}
    assert rejection(with_parts(audio)).code == "data_url_too_large"


def test_video_jpeg_frames_at_and_over() -> None:
    frame = base64.b64encode(jpeg(64, 64)).decode()
    at = "data:video/jpeg;base64," + ",".join([frame] * M.max_frames_per_data_url)
    part = {"type": "video_url", "video_url": {"url": at}}
    assert run(with_parts(part)).rejection is None
    over = at + "," + frame
    err = rejection(with_parts({"type": "video_url", "video_url": {"url": over}}))
    assert err.code == "video_frames_exceeded"
    # Thousands of one-byte frames in a tiny URL.
    tiny = "data:video/jpeg;base64," + ",".join(["AA=="] * 10_000)
    assert rejection(with_parts({"type": "video_url", "video_url": tiny})).code == (
        "video_frames_exceeded"
    )


def test_encoded_video_frames_are_not_counted() -> None:
    url = data_url("video/mp4", b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 100)
    assert run(with_parts({"type": "video_url", "video_url": {"url": url}})).rejection is None


def test_url_schemes() -> None:
    assert run(with_parts(image_part("https://example.com/a.png"))).rejection is None
    for url in ("file:///etc/passwd", "ftp://x/y.png", "gopher://x"):
        assert rejection(with_parts(image_part(url))).code == "media_url_not_allowed", url
    local = policy_from_yaml("limits: {multimodal: {allow_remote_urls: false}}")
    err = rejection(with_parts(image_part("http://example.com/a.png")), local)
    assert err.code == "media_url_not_allowed"
    assert run(with_parts(image_part(data_url("image/png", png(8, 8)))), local).rejection is None


def test_malformed_data_urls() -> None:
    assert rejection(with_parts(image_part("data:image/png;base64"))).code == "data_url_invalid"
    header = "data:" + "x" * 300 + ",AAAA"
    assert rejection(with_parts(image_part(header))).code == "data_url_invalid"


def test_responses_input_images() -> None:
    part = {"type": "input_image", "image_url": data_url("image/gif", gif(30000, 30000))}
    body = {"input": [{"role": "user", "content": [part]}]}
    err = check_multimodal(RequestView.build(body, path="/v1/responses"), P).rejection
    assert err is not None and err.code == "image_too_large"


def test_benign_multimodal_request_passes() -> None:
    body = with_parts(
        image_part(data_url("image/png", png(1024, 768))),
        image_part("https://example.com/photo.jpg"),
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    )
    result = run(body)
    assert result.rejection is None
    assert result.costs["media_parts"] == 3
    assert run({"messages": [{"role": "user", "content": "plain"}]}).costs == {}
