"""The sequences of vLLM's scoring routes: ``/score`` (and ``/v1/score``) and ``/rerank`` (and
``/v1/rerank``, ``/v2/rerank``), read as vLLM 0.32's request models read them
(``vllm/entrypoints/pooling/scoring/protocol.py``, ``io_processor.py``, ``utils.py``).

A score request pairs two sides: ``queries`` with ``documents`` or ``items``, ``data_1`` with
``data_2``, or ``text_1`` with ``text_2``; a rerank request pairs ``query`` with ``documents``.
Each side is one input or a list of them; an input is a string or ``{"content": [parts]}``
(text, image and video parts). One input on the first side is paired with every input of the
second (1:N), else they pair in order (N:N). Every pair is one sequence the model runs: a
cross-encoder tokenizes ``(query, document)`` as a pair with its special tokens (or renders the
``--chat-template`` with ``[{"role": "query"}, {"role": "document"}]`` when one is given), a
bi-encoder embeds each side alone, an LLM-as-reranker joins them. So each pair is counted as a
unit: both texts (and a token for a merge where they are joined), the ``instruction`` if any,
twice the tokenizer's special tokens, the media estimates of parts;
and, when the policy names the chat template (``limits.tokens.chat_template`` a file: vLLM's
``--chat-template``; vLLM never scores with the tokenizer's own template, which ``auto`` finds),
rendered as the scoring path renders it, the larger count winning.
A body that carries several pairings is counted for all of them.
"""

from __future__ import annotations

from typing import Any

from guard.prompt._units import ChatInput, Counting, PromptUnit, add_content
from guard.request import Endpoint, Path, classify_part, score_inputs, score_pairs

__all__ = ["score_units"]


def _text_of(value: Any) -> str | None:
    """The text vLLM makes of one input for a template (its text parts joined with newlines);
    None when it is not one vLLM reads."""
    if isinstance(value, str):
        return value
    content = value.get("content") if isinstance(value, dict) else None
    if not isinstance(content, list):
        return None
    texts = []
    for part in content:
        kind = classify_part(part)
        if kind.kind == "text":
            text = part if isinstance(part, str) else part.get(kind.field or "text")
            if isinstance(text, str):
                texts.append(text)
    return "\n".join(texts)


def _add_input(unit: PromptUnit, path: Path, value: Any, c: Counting) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "content":
                add_content(unit, (*path, key), inner, c)
            else:
                unit.add((*path, key), inner)
    else:
        unit.add(path, value)


def score_units(body: dict[str, Any], endpoint: Endpoint, c: Counting) -> list[PromptUnit]:
    units: list[PromptUnit] = []
    for first, second, pairs in score_pairs(body, endpoint):
        left, right = score_inputs(body[first]), score_inputs(body[second])
        listed = (isinstance(body[first], list), isinstance(body[second], list))
        for i in range(pairs):
            q = left[0] if len(left) == 1 else left[i] if i < len(left) else ""
            d = right[i] if i < len(right) else ""
            q_path: Path = (first, 0 if len(left) == 1 else i) if listed[0] else (first,)
            d_path: Path = (second, i) if listed[1] else (second,)
            # One token for a merge where an LLM-as-reranker joins the two texts.
            unit = PromptUnit(path=d_path, specials=2 * c.special_tokens, overhead=1)
            _add_input(unit, q_path, q, c)
            _add_input(unit, d_path, d, c)
            # Instruction-taking rerankers put it in every pair's prompt.
            unit.add(("instruction",), body.get("instruction"))
            q_text, d_text = _text_of(q), _text_of(d)
            if q_text is not None and d_text is not None:
                messages = [
                    {"role": "query", "content": q_text},
                    {"role": "document", "content": d_text},
                ]
                unit.chat = ChatInput(messages, body, "score")
            units.append(unit)
    return units
