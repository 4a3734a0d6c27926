"""guard.checks.multimodal: media parts, data-URL size, video frames, image dimensions."""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest

from guard.checks import CheckResult, check_multimodal
from guard.checks._media import image_size
from guard.errors import GuardError
from guard.policy import Policy, default_policy, policy_from_yaml
from guard.request import RequestView
from tests._support import bytecodes
from tests.guard.checks._images import (
    MAKERS,
    b64,
    bmp,
    data_url,
    gif,
    jpeg,
    png,
)

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


# -- image headers --------------------------------------------------------------------------------


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_image_size_from_headers(make: Any) -> None:
    encoded = base64.b64encode(make(1234, 567)).decode()
    assert image_size(encoded, 0, len(encoded)) == (1234, 567)
    prefixed = "xyz," + encoded
    assert image_size(prefixed, 4, len(prefixed)) == (1234, 567)


def test_jpeg_sof_after_large_segments_is_found_by_hopping() -> None:
    data = jpeg(4000, 3000, app_bytes=60_000)
    big = data + b"\x00" * 500_001
    encoded = base64.b64encode(big).decode()
    assert image_size(encoded, 0, len(encoded)) == (4000, 3000)
    # Hops over the segments: a scan of the 560 KB would be millions of bytecodes.
    assert bytecodes(lambda: image_size(encoded, 0, len(encoded))) < 20_000


def test_unknown_or_broken_images_give_none() -> None:
    tiff = b"II*\x00\x08\x00\x00\x00" + b"\x00" * 64
    no_scan = jpeg(64, 64)[: jpeg(64, 64).index(b"\xff\xda")]
    for payload in (b"hello world, not an image", b"\xff\xd8\xff", tiff, no_scan, png(8, 8)[:20]):
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
    prefix = "data:audio/x-wav;base64,"  # the payload a multiple of 4 characters long
    at = prefix + "A" * (M.max_data_url_bytes - len(prefix))
    audio = {"type": "audio_url", "audio_url": {"url": at}}
    assert run(with_parts(audio)).rejection is None
    audio["audio_url"] = {"url": at + "AAAA"}
    assert rejection(with_parts(audio)).code == "data_url_too_large"
    audio = {"type": "input_audio", "input_audio": {"data": "A" * (M.max_data_url_bytes + 1)}}
    assert rejection(with_parts(audio)).code == "data_url_too_large"


def test_video_jpeg_frames_at_and_over() -> None:
    frame = b64(jpeg(64, 64))
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


def test_encoded_video_is_refused_unless_allowed() -> None:
    url = data_url("video/mp4", b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 100)
    body = with_parts({"type": "video_url", "video_url": {"url": url}})
    assert rejection(body).code == "video_format_not_supported"
    allowed = policy_from_yaml("limits: {multimodal: {allow_encoded_video: true}}")
    assert run(body, allowed).rejection is None


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
    assert result.costs["media_pixels"] == 1024 * 768
    assert run({"messages": [{"role": "user", "content": "plain"}]}).costs == {}


# -- media recognised by what the upstream does with the part (issue 13) ----------------------

HUGE_PNG = png(30000, 30000)


def test_a_uuid_is_refused_and_would_make_a_text_part_an_image() -> None:
    part = {
        "type": "text",
        "text": "hi",
        "uuid": "u1",
        "image_url": data_url("image/png", HUGE_PNG),
    }
    err = rejection(with_parts(part))
    assert err.code == "media_uuid_not_allowed"
    assert err.param == "messages[0].content[1].uuid"
    # Where a uuid is allowed, the part is read as vLLM reads it: an image, sized.
    allowed = policy_from_yaml("limits: {multimodal: {allow_media_uuid: true}}")
    assert rejection(with_parts(part), allowed).code == "image_too_large"
    # A reference to cached media with no data is still a media part.
    ref = {"type": "image_url", "uuid": "victim-id", "image_url": None}
    assert run(with_parts(ref), allowed).costs["media_parts"] == 1
    assert rejection(with_parts(ref)).code == "media_uuid_not_allowed"
    # uuid: null is no uuid.
    assert run(with_parts({"type": "text", "text": "x", "uuid": None})).rejection is None


def test_parts_without_a_type_are_read_by_their_media_key() -> None:
    for key in ("image_url", "video_url", "audio_url"):
        url = data_url("image/png", HUGE_PNG)
        if key == "video_url":
            url = "data:video/jpeg;base64," + b64(HUGE_PNG)
        part = {key: url}
        expected = "image_too_large" if key != "audio_url" else None
        result = run(with_parts(part))
        code = result.rejection.code if result.rejection else None
        assert code == expected, key
        assert run(with_parts({key: {"url": "https://example.com/x"}})).costs["media_parts"] == 1


@pytest.mark.parametrize(
    "url",
    [
        "data:application/octet-stream;base64," + b64(HUGE_PNG),
        "DATA:image/png;base64," + b64(HUGE_PNG),
        "Data:IMAGE/PNG;base64," + b64(HUGE_PNG),
        "data:text/plain;base64," + b64(HUGE_PNG),
        "data:;base64," + b64(HUGE_PNG),
        "data:image/png;charset=x;base64," + b64(HUGE_PNG),
    ],
)
def test_image_mime_types_are_ignored_and_the_bytes_sniffed(url: str) -> None:
    assert rejection(with_parts(image_part(url))).code == "image_too_large"
    responses = {"type": "input_image", "image_url": url}
    assert rejection(with_parts(responses)).code == "image_too_large"


@pytest.mark.parametrize(
    "url",
    [
        " data:image/png;base64," + b64(HUGE_PNG),
        "\tdata:image/png;base64," + b64(HUGE_PNG),
        " file:///etc/passwd",
        "<file:///dev/zero>",
        "URL:file:///dev/zero",
        "httpx://example.com/a.png",
        "http ://example.com/a.png",
        "https://example.com/a b.png",
        "https://example.com/\na.png",
        "",
    ],
)
def test_urls_that_are_not_data_or_plain_http_are_refused(url: str) -> None:
    assert rejection(with_parts(image_part(url))).code == "media_url_not_allowed"
    video = {"type": "video_url", "video_url": {"url": url}}
    assert rejection(with_parts(video)).code == "media_url_not_allowed"


def test_uppercase_http_is_http() -> None:
    assert run(with_parts(image_part("HTTPS://example.com/a.png"))).rejection is None
    local = policy_from_yaml("limits: {multimodal: {allow_remote_urls: false}}")
    assert rejection(with_parts(image_part("HTTP://example.com/a.png")), local).code == (
        "media_url_not_allowed"
    )


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("data:image/png;base64," + b64(png(8, 8))[:20] + "\n" + b64(png(8, 8))[20:], "ws"),
        ("data:image/png;base64," + b64(png(8, 8))[:20] + " " + b64(png(8, 8))[20:], "ws"),
        ("data:image/png;base64," + b64(png(8, 8)).rstrip("="), "pad"),
        ("data:image/png;base64,-" + b64(png(8, 8))[1:], "alphabet"),
        ("data:image/png;BASE64," + b64(png(8, 8)), "case"),
        ("data:image/png," + b64(png(8, 8)), "not base64"),
        ("data:image/png;base64," + b64(png(8, 8)) + "," + b64(HUGE_PNG), "second comma"),
        ("data:image/png;base64,", "empty"),
    ],
)
def test_data_urls_must_be_plain_base64(url: str, code: str) -> None:
    err = rejection(with_parts(image_part(url)))
    assert err.code in ("data_url_invalid", "image_format_not_supported"), code
    if code != "empty":
        assert err.code == "data_url_invalid", code


def test_a_newline_does_not_hide_a_huge_image() -> None:
    encoded = b64(HUGE_PNG)
    url = "data:image/png;base64," + "\n".join(encoded[i : i + 76] for i in range(0, 200, 76))
    assert rejection(with_parts(image_part(url))).code == "data_url_invalid"


@pytest.mark.parametrize(
    "payload",
    [
        b"II*\x00\x08\x00\x00\x00" + b"\x00" * 64,  # TIFF
        b"qoif" + struct.pack(">II", 30000, 30000) + b"\x03\x00" + b"\x00" * 20,  # QOI
        b"P6\n30000 30000\n255\n" + b"\x00" * 16,  # PPM
        b"8BPS\x00\x01" + b"\x00" * 40,  # PSD
        b"\x00\x00\x01\x00\x01\x00" + b"\x00" * 40,  # ICO
        b"hello, world" * 4,
    ],
)
def test_formats_the_guard_cannot_size_are_refused(payload: bytes) -> None:
    url = data_url("image/png", payload)
    assert rejection(with_parts(image_part(url))).code == "image_format_not_supported"


def test_headers_read_as_pillow_reads_them() -> None:
    # A later IHDR or SOF overrides the size; a GIF frame grows the screen; a BMP height with
    # a top byte other than 0xFF is unsigned.
    cases = [
        png(8, 8, extra_ihdr=(30000, 30000)),
        jpeg(8, 8, second_sof=(30000, 30000)),
        gif(8, 8, frame=(29990, 29990, 10, 10)),
        bmp(8, 8, raw_height=0xFE000000),
    ]
    for data in cases:
        assert rejection(with_parts(image_part(data_url("image/png", data)))).code == (
            "image_too_large"
        ), data[:4]
    flipped = bmp(8, 8, raw_height=(2**32 - 8))
    assert run(with_parts(image_part(data_url("image/bmp", flipped)))).rejection is None


def test_headers_another_pillow_reader_could_take_are_refused() -> None:
    gbr = b"\x00\x00\x00\x30\x00\x00\x00\x01" + b"\x00" * 64  # a GIMP brush header
    im = b"GIF89a: x\nImage size: 30000 30000\n" + b"\x00" * 64  # IM reads a GIF's first line
    fli = jpeg(8, 8)[:4] + b"\x11\xaf" + jpeg(8, 8)[6:]  # an FLI magic where a JPEG has a length
    for data in (gbr, im, fli):
        err = rejection(with_parts(image_part(data_url("image/png", data))))
        assert err.code == "image_format_not_supported"


def test_every_video_frame_is_sized() -> None:
    small = b64(jpeg(64, 64))
    frames = [small] * 10 + [b64(HUGE_PNG)]
    url = "data:Video/JPEG;base64," + ",".join(frames)
    err = rejection(with_parts({"type": "video_url", "video_url": {"url": url}}))
    assert err.code == "image_too_large"
    bad = "data:video/jpeg;base64," + ",".join([small, "not base64!"])
    assert rejection(with_parts({"type": "video_url", "video_url": bad})).code == "data_url_invalid"


def test_total_pixels_are_capped() -> None:
    side = int(M.max_image_pixels**0.5)
    image = image_part(data_url("image/png", png(side, side)))
    count = M.max_total_pixels // (side * side)
    assert run(with_parts(*[image] * count)).rejection is None
    assert rejection(with_parts(*[image] * (count + 1))).code == "media_pixels_exceeded"
    frame = b64(png(side, side))
    video = "data:video/jpeg;base64," + ",".join([frame] * (count + 1))
    err = rejection(with_parts({"type": "video_url", "video_url": {"url": video}}))
    assert err.code == "media_pixels_exceeded"


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_embeds", "image_embeds": "AAAA"},
        {"type": "audio_embeds", "audio_embeds": {"t": "AAAA"}},
        {"type": "video_embeds", "video_embeds": "AAAA"},
        {"type": "prompt_embeds", "data": "AAAA"},
        {"type": "image_pil", "image_pil": "x"},
        {"image_embeds": {"a": "AAAA"}},  # no type: read by its key
    ],
)
def test_embeddings_parts_are_refused(part: dict[str, Any]) -> None:
    assert rejection(with_parts(part)).code == "media_embeds_not_allowed"


@pytest.mark.parametrize("fmt", ["wav;base64,AAAA", "wav,x", "wav\n", "", "a" * 40, 7])
def test_input_audio_format_cannot_smuggle_a_data_url(fmt: Any) -> None:
    part = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": fmt}}
    assert rejection(with_parts(part)).code == "data_url_invalid"


def test_input_audio_data_must_be_plain_base64() -> None:
    part = {"type": "input_audio", "input_audio": {"data": "UklG\nRg==", "format": "wav"}}
    assert rejection(with_parts(part)).code == "data_url_invalid"


def test_media_is_found_in_every_conversation_shape() -> None:
    part = image_part(data_url("image/png", HUGE_PNG))
    conversation = [{"role": "user", "content": [part]}]
    shapes = [
        ("/v1/embeddings", {"messages": conversation}),
        ("/v1/embeddings", {"messages": [conversation, conversation]}),
        ("/v1/embeddings", {"input": conversation}),
        ("/v1/embeddings", {"input": [conversation]}),
        ("/tokenize", {"messages": conversation}),
        ("/v1/chat/completions/batch", {"messages": [conversation]}),
        ("/v1/responses", {"input": [{"type": "function_call_output", "output": [part]}]}),
    ]
    for path, body in shapes:
        err = run(body, path=path).rejection
        assert err is not None and err.code == "image_too_large", (path, body.keys())


def test_benign_look_alikes_pass() -> None:
    small = data_url("image/png", png(64, 64))
    body = with_parts(
        image_part(small),
        {"type": "image_url", "image_url": {"url": small, "detail": "low"}},
        {"type": "input_image", "image_url": small},
        {"type": "video_url", "video_url": {"url": "data:video/jpeg;base64," + b64(jpeg(64, 64))}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "mp3"}},
    )
    result = run(body)
    assert result.rejection is None
    assert result.costs["media_parts"] == 5
