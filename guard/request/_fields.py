"""Reading request fields the way upstreams read them, shared by the checks and the counting.

The schema check insists on JSON types, but every check must stand alone (the order and the
set of checks are policy), and upstreams coerce: vLLM's pydantic models turn ``"n": "1000"`` and
``1000.0`` into 1000, llama.cpp truncates ``1e9 + 0.5`` to an int. So limits compare
:func:`lax_int` of a value, which rounds away from zero: a conservative reading for caps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

from guard.request._view import Endpoint

__all__ = [
    "INJECT_FIELD",
    "OUTPUT_FIELDS",
    "SCORE_SIDES",
    "Path",
    "fmt_path",
    "is_int",
    "is_number",
    "lax_bool",
    "lax_int",
    "output_fields",
    "prompt_items",
    "requested_output",
    "score_inputs",
    "score_pairs",
    "sequences_per_prompt",
]

Path = tuple[str | int, ...]

# Fields that cap the output, in the order the upstream prefers them (vLLM chat:
# max_completion_tokens or max_tokens; llama.cpp: n_predict; TGI: max_new_tokens).
OUTPUT_FIELDS: dict[Endpoint, tuple[str, ...]] = {
    "chat": ("max_completion_tokens", "max_tokens", "n_predict", "max_new_tokens"),
    "completions": ("max_tokens", "n_predict", "max_new_tokens"),
    "responses": ("max_output_tokens",),
    "other": ("max_tokens", "max_completion_tokens", "n_predict", "max_new_tokens"),
}
# Where a missing output cap is injected.
INJECT_FIELD: dict[Endpoint, str] = {
    "chat": "max_tokens",
    "completions": "max_tokens",
    "responses": "max_output_tokens",
}

# The pairings vLLM's scoring request models accept (first side, second side): /score's
# ScoreQueriesDocumentsRequest, ScoreQueriesItemsRequest, ScoreDataRequest, ScoreTextRequest;
# /rerank's RerankRequest. Each side is one input or a list (a string or {"content": [parts]}).
SCORE_SIDES: dict[Endpoint, tuple[tuple[str, str], ...]] = {
    "score": (
        ("queries", "documents"),
        ("queries", "items"),
        ("data_1", "data_2"),
        ("text_1", "text_2"),
    ),
    "rerank": (("query", "documents"),),
}

_MAX_LAX_STR = 64


def lax_int(value: Any) -> int | None:
    """``value`` as an int the way a lenient upstream would read it, rounded away from zero;
    ``None`` when no upstream would read it as a number."""
    if value is None:  # the common case: the field is absent
        return None
    if type(value) is int:
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return math.ceil(value) if value > 0 else math.floor(value)
    if isinstance(value, str) and len(value) <= _MAX_LAX_STR:
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:
            return lax_int(float(text))
        except ValueError:
            return None
    return None


def lax_float(value: Any) -> float | None:
    """``value`` as a number the way pydantic's lax mode reads a float field (a bool, an int, a
    float, a numeric string of any length: ``float`` is linear in it and the body is already
    size-bounded); None when it would not read it as one."""
    if isinstance(value, bool | int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


# pydantic's lax booleans (vLLM's request models type their switches as bool).
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def lax_bool(value: Any) -> bool | None:
    """``value`` as pydantic (vLLM's request models) reads a bool: true/false, 0/1 and the
    strings ``"true"``, ``"no"``, ``"1"``, ...; None when no upstream would read it so."""
    if isinstance(value, bool):
        return value
    if type(value) is int and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and len(value) <= _MAX_LAX_STR:
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    return None


def is_int(value: Any) -> bool:
    """A JSON integer (``True`` is not one)."""
    return type(value) is int


def is_number(value: Any) -> bool:
    return type(value) in (int, float)


def fmt_path(path: Path) -> str:
    """``messages[3].content``; keys cut to 40 characters."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            key = part if len(part) <= 40 else part[:40] + "..."
            out += f".{key}" if out else key
    return out


def output_fields(endpoint: Endpoint) -> tuple[str, ...]:
    return OUTPUT_FIELDS.get(endpoint, ())


def requested_output(body: Mapping[str, Any], endpoint: Endpoint) -> tuple[str, int] | None:
    """The largest output cap set, as (field, value); None when none is set. The largest,
    because upstreams differ on which field wins (vLLM ignores a ``max_completion_tokens`` of 0
    in favour of ``max_tokens``)."""
    found: tuple[str, int] | None = None
    for name in output_fields(endpoint):
        value = lax_int(body.get(name))
        if value is None:
            continue
        if value <= 0:  # llama.cpp: -1 is unlimited; llama-cpp-python: 0 and below too
            return name, value
        if found is None or value > found[1]:
            found = (name, value)
    return found


def prompt_items(value: Any) -> list[Any] | None:
    """The prompts of a ``prompt`` / ``input`` field: a string or one token-id list is one
    prompt; a list of strings or of token-id lists is several. None when it is neither."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        if not value:
            return value
        if is_int(value[0]):
            return [value]
        # Strings or token-id lists; anything else (responses API input items) is not a prompt.
        return value if isinstance(value[0], str | list) else None
    return None


def sequences_per_prompt(body: Mapping[str, Any]) -> int:
    """Sequences the upstream generates per prompt: ``max(n, best_of)``, at least 1."""
    n = lax_int(body.get("n"))
    best_of = lax_int(body.get("best_of"))
    return max(1, n or 1, best_of or 1)


def score_inputs(value: Any) -> list[Any]:
    """One side of a scoring pair as a list of inputs (one input, or a list of them)."""
    return value if isinstance(value, list) else [value]


def score_pairs(body: dict[str, Any], endpoint: Endpoint) -> Iterator[tuple[str, str, int]]:
    """Each pairing the body carries: (first side, second side, pairs)."""
    for first, second in SCORE_SIDES.get(endpoint, ()):
        if first in body and second in body:
            left, right = score_inputs(body[first]), score_inputs(body[second])
            yield first, second, len(right) if len(left) == 1 else max(len(left), len(right))
