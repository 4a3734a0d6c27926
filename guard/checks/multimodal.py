"""The multimodal check: media recognised by what the upstream does with a part, and sized.

Parts are found wherever the upstream reads them (chat ``messages``, batched conversations,
embeddings ``messages``/``input`` given as chat, Responses ``input`` items and list ``output``s)
and classified as vLLM 0.32 classifies them (:func:`guard.request.classify_part`): by ``type``, or, when
the part has a ``uuid`` or no ``type``, by its first media key. For each request:

- a ``uuid`` on a part is refused unless ``allow_media_uuid`` (``media_uuid_not_allowed``): vLLM
  keys its media caches by it, across tenants; ``*_embeds``, ``prompt_embeds`` and
  ``image_pil`` parts are refused (``media_embeds_not_allowed``): tensors handed to the model;
- media parts are counted (``media_parts_exceeded``);
- a media URL is a data URL when its first five characters are ``data:`` in any case (as vLLM
  reads it); anything else must be ``http(s)://`` with ``allow_remote_urls`` and hold no space
  or control character (``media_url_not_allowed``: llama-cpp-python strips a leading space and
  opens ``file:``, ``ftp:``, ``<...>`` and ``URL:...`` with ``urlopen``);
- a data URL is at most ``max_data_url_bytes`` (``data_url_too_large``), has a header ending in
  ``;base64`` (case-sensitive, as vLLM reads it) and plain base64 after its first comma: no
  whitespace or newline (vLLM refuses them, llama-cpp-python skips them), no second comma
  (llama-cpp-python decodes only what lies between the first two) (``data_url_invalid``);
- an image (``image_url``/``input_image``) is sniffed from its bytes, whatever MIME type it
  declares, and sized from its header (:mod:`guard.checks._media`): an unknown, malformed or
  ambiguous format is refused (``image_format_not_supported``), and so is one over
  ``max_image_pixels`` (``image_too_large``);
- a video is ``video/jpeg`` frames (comma-separated base64 images, the MIME compared in any
  case): at most ``max_frames_per_data_url`` (``video_frames_exceeded``), each sized like an
  image; other inline video (mp4, ...) is refused unless ``allow_encoded_video``
  (``video_format_not_supported``);
- the pixels of all images and frames of the request are capped (``media_pixels_exceeded``);
- ``input_audio`` is sized as the data URL vLLM builds from it, ``data:audio/{format};base64,
  {data}``, so its ``format`` must be a plain name (``data_url_invalid``).

Parts of types vLLM does not know (``image``, ``file``, ...) are sized by their URL-like keys.
Remote media is the upstream's to fetch and cap; audio length is bounded by bytes only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import Field

from guard._limits import LimitsModel, PosInt
from guard.checks._media import is_strict_base64, sniff_image
from guard.checks._policy import PolicyView
from guard.checks._result import CheckResult, pure_check
from guard.errors import GuardError, LimitExceeded
from guard.request import (
    PartKind,
    Path,
    RequestView,
    classify_part,
    fmt_path,
    iter_parts,
    media_payload,
)

__all__ = ["MEDIA_TYPES", "MultimodalLimits", "MultimodalReads", "check_multimodal"]


class MultimodalLimits(LimitsModel):
    max_media_parts: PosInt = Field(
        default=16,
        description="Most media content parts (`image_url`, `video_url`, `audio_url`, "
        "`input_audio`, `input_image`, `file`, ...) in one request, recognised as vLLM does: by "
        "the part's type, or by its first media key when it has a `uuid` or no `type`.",
    )
    max_data_url_bytes: PosInt = Field(
        default=1_048_576,
        description="Longest `data:` URL or inline base64 media (`input_audio.data`), in "
        "bytes. `limits.json.max_string_bytes` also applies.",
    )
    max_frames_per_data_url: PosInt = Field(
        default=64,
        description="Most frames in one `video/jpeg` data URL (vLLM's comma-separated base64 "
        "images; it decodes the first 32). Every frame is sized like an image.",
    )
    max_image_pixels: PosInt = Field(
        default=25_000_000,
        description="Largest width x height of an inline image or video frame, read from its "
        "header without decoding it (a tiny file can declare huge dimensions), whatever MIME "
        "type the data URL declares (vLLM ignores it). PNG, JPEG, GIF, BMP and WebP are sized; "
        "other formats are refused (`image_format_not_supported`). Pillow warns at 89 M, "
        "vLLM refuses over 179 M.",
    )
    max_total_pixels: PosInt = Field(
        default=100_000_000,
        description="Most pixels of all inline images and video frames of one request "
        "together (`media_pixels_exceeded`): the upstream decodes them all (3 bytes a pixel "
        "in RGB: 300 MB at the default).",
    )
    allow_remote_urls: bool = Field(
        default=True,
        description="Accept `http(s)://` media URLs (the upstream fetches them; the guard "
        "cannot size them). Other schemes (`file:`, ...) and URLs with spaces or control "
        "characters (llama-cpp-python's `urlopen` strips them) are always refused. Set it to "
        "`false` in front of llama-cpp-python, which opens any non-`data:` URL with `urlopen` "
        "(no timeout, no size cap), or of a vLLM without `--allowed-media-domains`.",
    )
    allow_encoded_video: bool = Field(
        default=False,
        description="Accept inline video that is not `video/jpeg` frames (mp4, webm, ...). "
        "Refused by default (`video_format_not_supported`): the guard does not parse "
        "containers, and vLLM's OpenCV loader grabs every frame up to the last one sampled, so "
        "1 MB of video can decode thousands of frames.",
    )
    allow_media_uuid: bool = Field(
        default=False,
        description="Accept a `uuid` on content parts. Refused by default "
        "(`media_uuid_not_allowed`): vLLM uses it instead of the content hash as the key of "
        "its media caches, so one tenant can reuse or poison what another sent, and a part "
        "with a `uuid` and no data costs media the guard cannot size.",
    )


# Part types counted as media when vLLM reads them by type (and those other servers read).
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
# Keys of a part of another type, at its top level or one level down, that hold a URL or
# inline media.
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
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
_AUDIO_FORMAT = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]{0,31}")


@dataclass(slots=True)
class _Request:
    limits: MultimodalLimits
    parts: int = 0
    pixels: int = 0


class MultimodalReads(Protocol):
    """The limit sets the multimodal check reads."""

    @property
    def multimodal(self) -> MultimodalLimits: ...


@pure_check
def check_multimodal(view: RequestView, policy: PolicyView[MultimodalReads]) -> CheckResult | None:
    body = view.obj
    if body is None:
        return None
    state = _Request(policy.limits.multimodal)
    for path, part in iter_parts(body, view.endpoint):
        if isinstance(part, dict):
            _check_part(part, path, state)
    if not state.parts:
        return None
    return CheckResult.passed({"media_parts": state.parts, "media_pixels": state.pixels})


def _check_part(part: dict[str, Any], path: Path, state: _Request) -> None:
    limits = state.limits
    if part.get("uuid") is not None and not limits.allow_media_uuid:
        raise GuardError(
            "media_uuid_not_allowed",
            "content parts may not carry a uuid (the upstream's media cache key)",
            param=fmt_path((*path, "uuid")),
        )
    kind = classify_part(part)
    if kind.kind == "text":
        return
    if kind.kind == "unknown" and _MEDIA_KEYS.isdisjoint(part):
        return  # not media to any reader (the schema check refuses the type)
    state.parts += 1
    if state.parts > limits.max_media_parts:
        raise LimitExceeded(
            "media_parts_exceeded",
            f"more than {limits.max_media_parts} media parts in the request",
            param=fmt_path(path),
        )
    if kind.kind == "embeds":
        raise GuardError(
            "media_embeds_not_allowed",
            "embedding and object content parts (image_embeds, audio_embeds, video_embeds, "
            "prompt_embeds, image_pil) are not accepted",
            param=fmt_path(path),
        )
    if kind.kind == "media":
        _check_media_part(part, path, kind, state)
    else:
        _check_other_part(part, path, kind, state)


def _check_media_part(part: dict[str, Any], path: Path, kind: PartKind, state: _Request) -> None:
    payload, rel = media_payload(part, kind)
    at = (*path, *rel)
    if kind.field == "input_audio":
        if isinstance(payload, dict):
            _check_input_audio(payload, at, state)
    elif isinstance(payload, str):
        _check_url(payload, at, kind.modality, state, url_key=True)


def _check_other_part(part: dict[str, Any], path: Path, kind: PartKind, state: _Request) -> None:
    modality = kind.modality if kind.kind == "other_media" else None
    for key, value in part.items():
        if key not in _MEDIA_KEYS:
            continue
        if isinstance(value, str):
            _check_url(value, (*path, key), modality, state, url_key=key not in _RAW_KEYS)
        elif isinstance(value, dict):
            for sub, inner in value.items():
                if sub in _MEDIA_KEYS and isinstance(inner, str):
                    at = (*path, key, sub)
                    _check_url(inner, at, modality, state, url_key=sub not in _RAW_KEYS)


# Keys holding raw base64 rather than a URL.
_RAW_KEYS = frozenset({"data", "file_data"})


def _check_input_audio(audio: dict[str, Any], path: Path, state: _Request) -> None:
    fmt = audio.get("format")
    if fmt is not None and not (isinstance(fmt, str) and _AUDIO_FORMAT.fullmatch(fmt)):
        raise GuardError(
            "data_url_invalid",
            "input_audio.format must be a plain format name (wav, mp3, ...)",
            param=fmt_path((*path, "format")),
        )
    data = audio.get("data")
    if isinstance(data, str):
        param = fmt_path((*path, "data"))
        _check_size(data, param, state.limits)
        if not is_strict_base64(data):
            raise _not_base64(param)


def _size(text: str, limit: int) -> int:
    n = len(text)
    if n <= limit and not text.isascii():
        n = len(text.encode("utf-8", "surrogatepass"))
    return n


def _check_size(value: str, param: str, limits: MultimodalLimits) -> None:
    size = _size(value, limits.max_data_url_bytes)
    if size > limits.max_data_url_bytes:
        raise LimitExceeded(
            "data_url_too_large",
            f"inline media of {size} bytes exceeds the limit of {limits.max_data_url_bytes}",
            param=param,
        )


def _check_url(
    value: str, path: Path, modality: str | None, state: _Request, *, url_key: bool
) -> None:
    param = fmt_path(path)
    limits = state.limits
    _check_size(value, param, limits)
    if value[:5].lower() == "data:":
        _check_data_url(value, param, modality, state)
        return
    if not url_key:
        if not is_strict_base64(value):
            raise _not_base64(param)
        return
    scheme = _SCHEME.match(value)
    name = scheme.group()[:-1].lower() if scheme else ""
    if name not in ("http", "https") or not limits.allow_remote_urls:
        shown = f"the scheme {name!r}" if scheme else "no scheme"
        raise GuardError(
            "media_url_not_allowed", f"media URLs with {shown} are not accepted", param=param
        )
    if " " in value or not value.isprintable():
        raise GuardError(
            "media_url_not_allowed",
            "media URLs may not hold spaces or control characters",
            param=param,
        )


def _not_base64(param: str) -> GuardError:
    return GuardError(
        "data_url_invalid",
        "inline media must be plain base64 (no whitespace, newlines or other characters, "
        "padded to a multiple of 4)",
        param=param,
    )


def _check_data_url(url: str, param: str, modality: str | None, state: _Request) -> None:
    comma = url.find(",", 5, 5 + _MAX_HEADER)
    if comma < 0:
        raise GuardError("data_url_invalid", "a data: URL needs a header and a comma", param=param)
    media_type, sep, encoding = url[5:comma].rpartition(";")
    if not sep or encoding != "base64":
        raise GuardError(
            "data_url_invalid",
            "a data: URL must be base64, its header ending in ';base64' (in lower case)",
            param=param,
        )
    media_type = media_type.partition(";")[0].lower()
    start = comma + 1
    if modality == "video" or (modality is None and media_type == "video/jpeg"):
        if media_type == "video/jpeg":
            _check_frames(url, start, param, state)
        elif not state.limits.allow_encoded_video:
            raise GuardError(
                "video_format_not_supported",
                "inline video must be video/jpeg frames; encoded video (mp4, webm, ...) is "
                "not accepted",
                param=param,
            )
        elif not is_strict_base64(url, start):
            raise _not_base64(param)
    elif modality == "image" or (modality is None and media_type.startswith("image/")):
        _check_image(url, start, len(url), param, state)
    elif not is_strict_base64(url, start):
        raise _not_base64(param)


def _check_frames(url: str, start: int, param: str, state: _Request) -> None:
    limit = state.limits.max_frames_per_data_url
    frames = url.count(",", start) + 1
    if frames > limit:
        raise LimitExceeded(
            "video_frames_exceeded",
            f"{frames} frames in one video data URL; the limit is {limit}",
            param=param,
        )
    pos = start
    for _ in range(frames):
        end = url.find(",", pos)
        if end < 0:
            end = len(url)
        _check_image(url, pos, end, param, state)
        pos = end + 1


def _check_image(url: str, start: int, end: int, param: str, state: _Request) -> None:
    if not is_strict_base64(url, start, end):
        raise _not_base64(param)
    header = sniff_image(url, start, end)
    if header is None:
        raise GuardError(
            "image_format_not_supported",
            "inline images must be PNG, JPEG, GIF, BMP or WebP with a well-formed header",
            param=param,
        )
    limits = state.limits
    if header.pixels > limits.max_image_pixels:
        raise LimitExceeded(
            "image_too_large",
            f"an image of {header.width} x {header.height} pixels exceeds the limit of "
            f"{limits.max_image_pixels} pixels",
            param=param,
        )
    state.pixels += header.pixels
    if state.pixels > limits.max_total_pixels:
        raise LimitExceeded(
            "media_pixels_exceeded",
            f"the request's images and video frames hold more than {limits.max_total_pixels} "
            "pixels",
            param=param,
        )
