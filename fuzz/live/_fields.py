"""The fields of a live request beyond a plain chat: what names an under-count, and the attack
class a live finding is filed under.

An under-count (the upstream counted more prompt tokens than the guard) is named by the shape
of its minimised request: the field paths a plain chat or completion (:data:`BASELINE`) does
not have, ``messages[].content[type=refusal].refusal`` say; :data:`OVERHEAD` when there are
none (the chat template's own text).
"""

from __future__ import annotations

from typing import Any

from fuzz.live._request import LiveRequest

__all__ = [
    "BASELINE",
    "OVERHEAD",
    "baseline_body",
    "leaves",
    "payload_class",
    "remove_paths",
    "shape_paths",
    "shape_signature",
]

# The name of an under-count that needs no field beyond a plain chat's: the template's own text.
OVERHEAD = "template-overhead"

# The fields of a plain chat (content a string or text parts) and a plain completion: an
# under-count needing none but these is the chat template's own overhead.
BASELINE: frozenset[str] = frozenset(
    {
        "model",
        "messages",
        "messages[]",
        "messages[].role",
        "messages[].content",
        "messages[].content[type=text]",
        "messages[].content[type=text].text",
        "prompt",
        "max_tokens",
        "max_completion_tokens",
        "stream",
        "temperature",
        "seed",
    }
)
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
_GUIDED = frozenset(
    {
        "grammar",
        "guided_grammar",
        "guided_regex",
        "guided_json",
        "guided_choice",
        "structured_outputs",
        "response_format",
        "regex",
    }
)
_MEDIA = frozenset({"image_url", "video_url", "audio_url", "input_audio", "image", "file", "uuid"})
_FAN_OUT = frozenset(
    {"n", "best_of", "logprobs", "top_logprobs", "prompt_logprobs", "logit_bias", "stop"}
)


def _item_path(prefix: str, item: Any) -> str:
    """A list item's path: ``[]``, or ``[type=...]`` for a content part with a string type
    (what a template renders depends on a part's type, not on a tool's)."""
    kind = item.get("type") if isinstance(item, dict) else None
    if isinstance(kind, str) and prefix.endswith("content"):
        return f"{prefix}[type={kind}]"
    return f"{prefix}[]"


def shape_paths(doc: Any, prefix: str = "") -> set[str]:
    """Every field path of ``doc``: list items as ``[]``, content parts as ``[type=...]``
    (``messages[].content[type=refusal].refusal``), ``type`` keys left out."""
    out: set[str] = set()
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k == "type" and isinstance(v, str):
                continue
            path = f"{prefix}.{k}" if prefix else str(k)
            out.add(path)
            out |= shape_paths(v, path)
    elif isinstance(doc, list):
        for item in doc[:64]:
            path = _item_path(prefix, item)
            out.add(path)
            out |= shape_paths(item, path)
    return out


def leaves(paths: set[str]) -> list[str]:
    """The paths no other path extends (the deepest fields)."""
    return sorted(p for p in paths if not any(q != p and q.startswith(p) for q in paths))


def shape_signature(doc: Any) -> str:
    """The fields of ``doc`` beyond :data:`BASELINE`, as a cause name."""
    novel = shape_paths(doc) - BASELINE
    deepest = leaves(novel)
    return "+".join(deepest)[:200] if deepest else OVERHEAD


def remove_paths(doc: Any, paths: set[str], prefix: str = "") -> Any:
    """A copy of ``doc`` without the fields whose :func:`shape_paths` name is in ``paths``."""
    if isinstance(doc, dict):
        out: dict[str, Any] = {}
        for k, v in doc.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            if path not in paths:
                out[k] = remove_paths(v, paths, path)
        return out
    if isinstance(doc, list):
        items = []
        for item in doc:
            path = _item_path(prefix, item)
            if path not in paths:
                items.append(remove_paths(item, paths, path))
        return items
    return doc


def _plain_text(content: Any) -> str:
    """A message content as the plain text a chat of text parts carries."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = [
        p["text"]
        for p in content
        if isinstance(p, dict) and p.get("type") in _TEXT_PARTS and isinstance(p.get("text"), str)
    ]
    return "".join(texts)


def baseline_body(doc: Any) -> dict[str, Any] | None:
    """``doc`` reduced to the fields of :data:`BASELINE`: every message a role and its text
    (text parts joined), or None when it is not an object."""
    if not isinstance(doc, dict):
        return None
    top = {p for p in BASELINE if "." not in p and "[" not in p}
    out = {k: v for k, v in doc.items() if k in top and k not in ("messages", "prompt")}
    if isinstance(doc.get("prompt"), str):
        out["prompt"] = doc["prompt"]
    if isinstance(doc.get("messages"), list):
        out["messages"] = [
            {"role": m.get("role"), "content": _plain_text(m.get("content"))}
            for m in doc["messages"]
            if isinstance(m, dict)
        ]
    return out


def _keys(doc: Any, out: set[str], depth: int = 0) -> int:
    """Collect every key; return the nesting depth."""
    deepest = depth
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.add(str(k))
            deepest = max(deepest, _keys(v, out, depth + 1))
    elif isinstance(doc, list):
        for v in doc[:256]:
            deepest = max(deepest, _keys(v, out, depth + 1))
    return deepest


def payload_class(req: LiveRequest, cause: str) -> str:
    """The THREATS.md class a finding on a live server is filed under."""
    if cause.startswith("undercount:"):
        return "volume"
    keys: set[str] = set()
    depth = _keys(req.body, keys) if req.body is not None else 0
    if keys & _GUIDED:
        return "guided_decoding"
    if keys & _MEDIA:
        return "multimodal_fan_out"
    if "chat_template" in keys:
        return "request_chat_template"
    if "chat_template_kwargs" in keys:
        return "template_kwargs"
    if keys & _FAN_OUT:
        return "fan_out"
    if depth > 32 or req.body is None:
        return "json_body_bomb"
    return "volume"
