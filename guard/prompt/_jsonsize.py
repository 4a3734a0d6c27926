"""The size of a JSON value as chat templates print it, computed without printing it.

Templates print structured values (tools, tool calls and their arguments, documents) with
``tojson``: Hugging Face's is ``json.dumps(x, ensure_ascii=False, indent=None)`` with the
default separators (``", "``, ``": "``), and some templates (Llama 3.x) pass ``indent=4``.
Whitespace costs tokens, so compact JSON under-counts what the upstream tokenizes (up to 4x for
deep nesting). The indented form is never shorter than the default one, which is never shorter
than the compact one, so the UTF-8 size of ``json.dumps(x, ensure_ascii=False, indent=4)`` bounds
every such rendering with ``indent <= 4``. :func:`indent4_size` computes it in one walk, stopping
once past a cap (an attacker's deeply indented array is never built to find out);
:func:`indent4_text` builds it when its size is known to be small enough.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["escaped_size", "indent4_size", "indent4_text", "utf8_len"]

_INDENT = 4
# Characters json.dumps writes as a two-character escape; other control characters take six.
_SHORT_ESCAPES = ("\n", "\r", "\t", "\b", "\f")
_CONTROL = {c: None for c in range(0x20)}


def utf8_len(text: str) -> int:
    """UTF-8 bytes of ``text`` as it is printed (a lone surrogate as its three bytes)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def escaped_size(text: str) -> int:
    """UTF-8 bytes of ``json.dumps(text, ensure_ascii=False)``, quotes included."""
    if text.isascii():
        size = len(text)
        if text.isprintable():
            return size + 2 + text.count('"') + text.count("\\")
    else:
        size = len(text.encode("utf-8", "surrogatepass"))
    size += 2 + text.count('"') + text.count("\\")
    controls = len(text) - len(text.translate(_CONTROL))
    if controls:
        short = sum(text.count(c) for c in _SHORT_ESCAPES)
        size += short + 5 * (controls - short)
    return size


def _scalar_size(value: Any) -> int:
    if value is None or value is True:
        return 4
    if value is False:
        return 5
    if isinstance(value, str):
        return escaped_size(value)
    if isinstance(value, int):
        return len(str(value)) if -(10**15) < value < 10**15 else len(json.dumps(value))
    return len(json.dumps(value))


def indent4_size(value: Any, cap: int) -> int:
    """UTF-8 bytes of ``json.dumps(value, ensure_ascii=False, indent=4)``, or some number above
    ``cap`` as soon as it is known to be larger. ``value`` is parsed JSON (bounded depth)."""
    return _size(value, 0, cap)


def _size(value: Any, depth: int, cap: int) -> int:
    if isinstance(value, dict):
        if not value:
            return 2
        pad = _INDENT * (depth + 1)
        # "{" "\n", the items joined by ",\n", "\n", pad(depth), "}"
        total = 4 + _INDENT * depth + (len(value) - 1) * 2
        for key, item in value.items():
            total += pad + escaped_size(str(key)) + 2 + _size(item, depth + 1, cap - total)
            if total > cap:
                return total
        return total
    if isinstance(value, list | tuple):
        if not value:
            return 2
        pad = _INDENT * (depth + 1)
        total = 4 + _INDENT * depth + (len(value) - 1) * 2
        for item in value:
            total += pad + _size(item, depth + 1, cap - total)
            if total > cap:
                return total
        return total
    return _scalar_size(value)


def indent4_text(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, indent=4)`` ("" when it cannot be dumped)."""
    try:
        return json.dumps(value, ensure_ascii=False, indent=_INDENT)
    except (TypeError, ValueError):
        return ""
