"""The multimodal check: how many media parts, how large inline media is, how many frames.

Media parts are the content parts of chat messages (and of the responses API's input items)
whose ``type`` is one of :data:`MEDIA_TYPES`. For each:

- the number of media parts in the request is capped (``media_parts_exceeded``);
- a ``data:`` URL, or inline base64 (``input_audio.data``, ``file_data``, ``image_embeds``),
  is capped in bytes (``data_url_too_large``); a ``data:`` URL without its comma is
  ``data_url_invalid``;
- a ``video/jpeg`` data URL (vLLM reads it as comma-separated base64 JPEG frames) is capped in
  frames, counted by its commas at C speed (``video_frames_exceeded``);
- a base64 image's declared width x height is capped, read from its header
  (:mod:`guard.checks._media`: PNG, GIF, BMP, WebP, JPEG) (``image_too_large``);
- a URL must be ``data:`` or, if the policy allows remote media, ``http(s)://``
  (``media_url_not_allowed``).

Not counted: frames of encoded video (mp4, webm, ...: decoding the container is the upstream's
work; the byte cap bounds it), frames of animated GIF/WebP/APNG, audio duration (bounded by
bytes), and anything behind a remote URL (the upstream downloads it; allow remote URLs only if
the upstream caps downloads).
"""

from __future__ import annotations

from typing import Any

from guard.checks._fields import Path, fmt_path
from guard.checks._media import image_size
from guard.checks._result import CheckResult, pure_check
from guard.errors import GuardError, LimitExceeded
from guard.policy._models import MultimodalPolicy, Policy
from guard.request_view import RequestView

__all__ = ["MEDIA_TYPES", "check_multimodal"]

MEDIA_TYPES = frozenset(
    {
        "image_url",
        "input_image",
        "image",
        "image_embeds",
        "image_pil",
        "video_url",
        "video",
        "audio_url",
        "input_audio",
        "audio",
        "file",
        "input_file",
    }
)
# Keys, at the part's top level or one level down, that hold a URL or inline media.
_MEDIA_KEYS = frozenset(
    {
        "url",
        "image_url",
        "video_url",
        "audio_url",
        "image",
        "video",
        "audio",
        "data",
        "file_data",
        "image_embeds",
        "input_audio",
        "file",
        "source",
    }
)
# A data URL's header (media type and parameters) must end within this many characters.
_MAX_HEADER = 256


@pure_check
def check_multimodal(view: RequestView, policy: Policy) -> CheckResult | None:
    body = view.obj
    if body is None:
        return None
    limits = policy.limits.multimodal
    parts = 0
    for name in ("messages", "input"):
        items = body.get(name)
        if not isinstance(items, list):
            continue
        for i, item in enumerate(items):
            content = item.get("content") if isinstance(item, dict) else None
            if not isinstance(content, list):
                continue
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                # isinstance first: an unhashable "type" (a list) must not reach the set lookup.
                if not isinstance(kind, str) or kind not in MEDIA_TYPES:
                    continue
                parts += 1
                path = (name, i, "content", j)
                if parts > limits.max_media_parts:
                    raise LimitExceeded(
                        "media_parts_exceeded",
                        f"more than {limits.max_media_parts} media parts in the request",
                        param=fmt_path(path),
                    )
                _check_part(part, path, limits)
    return CheckResult.passed({"media_parts": parts}) if parts else None


def _check_part(part: dict[str, Any], path: Path, limits: MultimodalPolicy) -> None:
    for key, value in part.items():
        if key not in _MEDIA_KEYS:
            continue
        if isinstance(value, str):
            _check_media(value, (*path, key), key, limits)
        elif isinstance(value, dict):
            for sub, inner in value.items():
                if sub in _MEDIA_KEYS and isinstance(inner, str):
                    _check_media(inner, (*path, key, sub), sub, limits)


def _size(text: str, limit: int) -> int:
    n = len(text)
    if n <= limit and not text.isascii():
        n = len(text.encode("utf-8", "surrogatepass"))
    return n


def _check_media(value: str, path: Path, key: str, limits: MultimodalPolicy) -> None:
    param = fmt_path(path)
    size = _size(value, limits.max_data_url_bytes)
    if size > limits.max_data_url_bytes:
        raise LimitExceeded(
            "data_url_too_large",
            f"inline media of {size} bytes exceeds the limit of {limits.max_data_url_bytes}",
            param=param,
        )
    head = value[:8].lower()
    if head.startswith("data:"):
        _check_data_url(value, param, limits)
        return
    scheme, sep, _ = value[:16].partition(":")
    if sep and scheme.isascii() and scheme.isalpha() and key not in ("data", "file_data"):
        scheme = scheme.lower()
        if scheme not in ("http", "https") or not limits.allow_remote_urls:
            raise GuardError(
                "media_url_not_allowed",
                f"media URLs with the scheme {scheme!r} are not accepted",
                param=param,
            )


def _check_data_url(url: str, param: str, limits: MultimodalPolicy) -> None:
    comma = url.find(",", 5, 5 + _MAX_HEADER)
    if comma < 0:
        raise GuardError("data_url_invalid", "a data: URL needs a header and a comma", param=param)
    header = url[5:comma].lower()
    media_type = header.split(";", 1)[0].strip()
    is_base64 = ";base64" in header
    if media_type == "video/jpeg":
        frames = url.count(",", comma + 1) + 1
        if frames > limits.max_frames_per_data_url:
            raise LimitExceeded(
                "video_frames_exceeded",
                f"{frames} frames in one video data URL; the limit is "
                f"{limits.max_frames_per_data_url}",
                param=param,
            )
    elif media_type.startswith("image/") and is_base64:
        dims = image_size(url, comma + 1, len(url))
        if dims is not None and dims[0] * dims[1] > limits.max_image_pixels:
            raise LimitExceeded(
                "image_too_large",
                f"an image of {dims[0]} x {dims[1]} pixels exceeds the limit of "
                f"{limits.max_image_pixels} pixels",
                param=param,
            )
