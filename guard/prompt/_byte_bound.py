"""The byte bound: UTF-8 bytes bound the tokens of byte-level BPE, so a prompt whose bytes prove
every limit holds is admitted untokenized.

Each sequence is weighed as the upstream prints it: its strings' bytes, structured values as
indent-4 JSON (:mod:`._jsonsize`), a tool call's arguments as sent (llama-cpp-python) or parsed
and printed again (vLLM), a prompt template's expansion bounded (:mod:`._placeholders`), the chat
template's own text (:mod:`._template_bound`), plus the tokens that are not text (ids, markup,
media, special tokens). The first sequence past its limit ends the proof: the prompt is then
counted (:mod:`._sequences`).
"""

from __future__ import annotations

from guard.prompt._jsonsize import indent4_size, utf8_len
from guard.prompt._placeholders import expansion_weight
from guard.prompt._template_bound import template_literal_bytes
from guard.prompt._terms import UNBOUNDED, PromptCounting, PromptLimits
from guard.prompt._units import PromptUnit

__all__ = ["byte_bound"]


def _least(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def byte_bound(
    units: list[PromptUnit], how: PromptCounting, limits: PromptLimits, template: str | None
) -> tuple[int, list[int]] | None:
    """The UTF-8 byte count (plus ids, overheads and the chat template's own text), in all and
    per unit, when it proves every limit holds; None when it does not."""
    unit_limit = limits.per_unit
    total_limit = limits.max_prompt_tokens
    depth = how.template_depth
    raw = how.units.media_as_text  # llama-cpp-python prints arguments as sent
    parsed = "vllm" in how.flavours
    total = 0
    sizes: list[int] = []
    for unit in units:
        found = _least(unit_limit, None if total_limit is None else total_limit - total)
        limit = UNBOUNDED if found is None else found
        size = unit.fixed
        for _, text in unit.texts:
            if len(text) > limit:  # bytes >= characters: no proof from bytes
                return None
            size += utf8_len(text)
            if size > limit:  # already past: no proof, whatever follows
                return None
        for _, value in unit.values:
            size += indent4_size(value, limit - size)
            if size > limit:
                return None
        for arg in unit.arguments:
            weight = utf8_len(arg.raw) if raw else 0
            if parsed:
                weight = max(weight, indent4_size(arg.parsed, limit - size))
            size += weight
            if size > limit:
                return None
        if unit.template is not None:
            cap = how.expansion_cap if found is None else found + 1
            size += expansion_weight(*unit.template, utf8_len, depth, cap)
        loops = unit.loops
        if loops is not None and template is not None:
            size += template_literal_bytes(template, loops)
        if size > limit:
            return None
        total += size
        sizes.append(size)
    return total, sizes
