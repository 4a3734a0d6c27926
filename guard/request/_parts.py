"""Chat content parts classified the way the upstreams read them, and where parts are found.

vLLM 0.32 (``vllm/renderers/chat_utils.py``, ``_parse_chat_message_content_mm_part``) decides
what a part is like this, and the checks copy it (not one spelling of it):

- a bare string in a content list is text;
- a part whose ``type`` is a known string and that has no ``uuid`` is read by its type:
  ``text``/``input_text``/``output_text`` read ``text``, ``refusal`` reads ``refusal``,
  ``thinking`` reads ``thinking``, ``tool_reference`` reads ``name`` (all rendered as text);
  ``image_url``, ``input_image``, ``audio_url``, ``input_audio``, ``video_url`` are media;
  ``image_embeds``, ``audio_embeds``, ``video_embeds``, ``prompt_embeds``, ``image_pil`` are
  tensors or objects handed to the model as they are;
- a part with a ``uuid`` (any value but null), or with no ``type``, has its ``type`` ignored:
  the first key present (even with a null value) in :data:`INFER_ORDER` decides. So
  ``{"type": "text", "text": "hi", "uuid": "u", "image_url": "data:..."}`` is an image;
- anything else is refused by vLLM (400).

llama-cpp-python 0.3.36 reads ``text`` and ``image_url`` parts only and refuses the rest. The
guard also treats ``image``, ``video``, ``audio``, ``file`` and ``input_file`` parts as media
(other servers read them; vLLM refuses them): a conservative union.

Keys of a part that vLLM does not know (:data:`KNOWN_PART_FIELDS`) are copied into the dict a
chat template sees when the template loops over content: they are prompt text too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from guard.request._fields import SCORE_SIDES, Path
from guard.request._view import Endpoint

__all__ = [
    "INFER_ORDER",
    "KNOWN_PART_FIELDS",
    "PART_TYPES",
    "TEXT_TYPES",
    "VIDEO_FRAMES_READ",
    "PartKind",
    "classify_part",
    "conversations",
    "iter_parts",
    "media_payload",
]

Kind = Literal["text", "media", "embeds", "other_media", "unknown"]
Modality = Literal["image", "audio", "video"]

# Part types read as text, and the field holding the text.
TEXT_TYPES: dict[str, str] = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
    "tool_reference": "name",
}
# Media part types: (modality, the field holding the URL or the inline data).
MEDIA_TYPES: dict[str, tuple[Modality, str]] = {
    "image_url": ("image", "image_url"),
    "input_image": ("image", "image_url"),
    "audio_url": ("audio", "audio_url"),
    "input_audio": ("audio", "input_audio"),
    "video_url": ("video", "video_url"),
}
# Parts handed to the model as tensors or objects (vLLM: --enable-mm-embeds,
# --enable-prompt-embeds): (modality, the field holding them).
EMBEDS_TYPES: dict[str, tuple[Modality, str]] = {
    "image_embeds": ("image", "image_embeds"),
    "audio_embeds": ("audio", "audio_embeds"),
    "video_embeds": ("video", "video_embeds"),
    "prompt_embeds": ("image", "data"),
    "image_pil": ("image", "image_pil"),
}
# Media types other servers read (vLLM refuses them): sized by their URL-like keys.
OTHER_MEDIA_TYPES: dict[str, Modality | None] = {
    "image": "image",
    "video": "video",
    "audio": "audio",
    "file": None,
    "input_file": None,
}
# Every part type read by its type (text, media, embeds, other servers' media).
PART_TYPES = frozenset({*TEXT_TYPES, *MEDIA_TYPES, *EMBEDS_TYPES, *OTHER_MEDIA_TYPES})
# vLLM's key inference when the type is ignored: the first key present wins.
INFER_ORDER: tuple[str, ...] = (
    "image_url",
    "image_pil",
    "image_embeds",
    "audio_embeds",
    "video_embeds",
    "prompt_embeds",
    "audio_url",
    "input_audio",
    "video_url",
    "tool_reference",
)
# The keys of every content-part TypedDict vLLM knows; the others reach the template.
KNOWN_PART_FIELDS = frozenset(
    {
        "type",
        "text",
        "image_url",
        "input_audio",
        "refusal",
        "file",
        "audio_url",
        "video_url",
        "image_pil",
        "uuid",
        "image_embeds",
        "audio_embeds",
        "video_embeds",
        "data",
        "name",
        "thinking",
        "closed",
    }
)
# Frames vLLM decodes from one video (its default num_frames; media_io_kwargs, which changes
# it, is refused).
VIDEO_FRAMES_READ = 32


@dataclass(frozen=True, slots=True)
class PartKind:
    """What a part is to the upstream.

    ``kind``: ``text`` (``field`` holds the text; ``None`` for a bare string), ``media``
    (``field`` holds the URL, or the ``input_audio`` object), ``embeds``, ``other_media``
    (sized by its URL-like keys), ``unknown`` (vLLM refuses it: an unknown or non-string
    ``type``, or an inferred part with no key to infer from). ``inferred``: the type was
    ignored (a ``uuid``, or no ``type``).
    """

    kind: Kind
    field: str | None = None
    modality: Modality | None = None
    inferred: bool = False


TEXT = PartKind("text")
UNKNOWN = PartKind("unknown")
_BY_TYPE: dict[str, PartKind] = {
    **{t: PartKind("text", f) for t, f in TEXT_TYPES.items()},
    **{t: PartKind("media", f, m) for t, (m, f) in MEDIA_TYPES.items()},
    **{t: PartKind("embeds", f, m) for t, (m, f) in EMBEDS_TYPES.items()},
    **{t: PartKind("other_media", None, m) for t, m in OTHER_MEDIA_TYPES.items()},
}
_BY_KEY: dict[str, PartKind] = {
    "image_url": PartKind("media", "image_url", "image", True),
    "image_pil": PartKind("embeds", "image_pil", "image", True),
    "image_embeds": PartKind("embeds", "image_embeds", "image", True),
    "audio_embeds": PartKind("embeds", "audio_embeds", "audio", True),
    "video_embeds": PartKind("embeds", "video_embeds", "video", True),
    "prompt_embeds": PartKind("embeds", "data", "image", True),
    "audio_url": PartKind("media", "audio_url", "audio", True),
    "input_audio": PartKind("media", "input_audio", "audio", True),
    "video_url": PartKind("media", "video_url", "video", True),
    "tool_reference": PartKind("text", "name", None, True),
}


def classify_part(part: Any) -> PartKind:
    """vLLM's reading of one content part (see the module docstring)."""
    if isinstance(part, str):
        return TEXT
    if not isinstance(part, dict):
        return UNKNOWN
    kind = part.get("type")
    if part.get("uuid") is None:
        if isinstance(kind, str):
            return _BY_TYPE.get(kind, UNKNOWN)
        if kind is not None:
            return UNKNOWN
    for key in INFER_ORDER:
        if key in part:
            return _BY_KEY[key]
    return UNKNOWN


def media_payload(part: dict[str, Any], kind: PartKind) -> tuple[Any, Path]:
    """The URL (or ``input_audio`` object) of a media part and where it is, relative to the part:
    the field's string, or its ``url`` when it is an object (both spellings, as vLLM's inferred
    path and llama-cpp-python accept both)."""
    field = kind.field
    if field is None:
        return None, ()
    value = part.get(field)
    if field == "input_audio":
        return value, (field,)
    if isinstance(value, dict):
        return value.get("url"), (field, "url")
    return value, (field,)


def conversations(body: dict[str, Any], endpoint: Endpoint) -> Iterator[tuple[Path, list[Any]]]:
    """Every list of chat messages in the body: ``messages`` (one conversation, or a list of
    them: vLLM's batched chat and embeddings), chat messages given as embeddings ``input``, and
    the Responses API's ``input`` items; and the inputs of vLLM's score and rerank sides
    (``{"content": [parts]}``, read as messages)."""
    sides = dict.fromkeys(side for pairing in SCORE_SIDES.get(endpoint, ()) for side in pairing)
    for side in sides:
        value = body.get(side)
        if isinstance(value, dict):
            yield (side,), [value]
        elif isinstance(value, list) and value:
            yield (side,), value
    for name in ("messages", "input"):
        value = body.get(name)
        if not isinstance(value, list) or not value:
            continue
        first = value[0]
        if isinstance(first, list):
            for i, conversation in enumerate(value):
                if isinstance(conversation, list):
                    yield (name, i), conversation
        elif isinstance(first, dict) or (name == "input" and endpoint == "responses"):
            yield (name,), value


def iter_parts(body: dict[str, Any], endpoint: Endpoint) -> Iterator[tuple[Path, Any]]:
    """Every content part of every message (or Responses input item) of the body, with its
    path: list ``content``, and the Responses API's list ``output`` of a tool result."""
    for base, messages in conversations(body, endpoint):
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                continue
            for key in ("content", "output"):
                content = message.get(key)
                if isinstance(content, list):
                    for j, part in enumerate(content):
                        yield (*base, i, key, j), part
