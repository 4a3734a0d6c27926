"""The prompt counted sequence by sequence, each held to what is left of the prompt cap or to
the window beside the output, whichever is less; the first crossed refuses.

A conversation with the upstream's chat template known is rendered as the upstream renders it
and counted (:mod:`._render`): exact; every render that succeeds is a candidate and the largest
wins; when every render fails because the upstream refuses the conversation itself (the
template's ``raise_exception``, vLLM's own checks), that is the answer. A scored pair counts
both ways, the larger winning (the template only when vLLM renders one: given with
``--chat-template``). Otherwise, or when no render succeeds, the fallback bound: each field
counted (:mod:`._fields`), plus, when a chat template is known, its literal text sized by the
request (:mod:`._template_bound`).
"""

from __future__ import annotations

from guard.errors import LimitExceeded
from guard.prompt._counting import UNBOUNDED, Over, PromptCounting, PromptLimits
from guard.prompt._fields import fields_tokens, template_tokens
from guard.prompt._render import render_count
from guard.prompt._template_bound import template_literal_tokens
from guard.prompt._template_source import ChatTemplate
from guard.prompt._units import PromptUnit
from guard.tokens import TokenCounter

__all__ = ["counted"]


def counted(
    units: list[PromptUnit],
    how: PromptCounting,
    limits: PromptLimits,
    template: ChatTemplate | None,
) -> list[int]:
    """Each unit's tokens, or the first limit crossed as LimitExceeded."""
    unit_limit = limits.per_unit
    remaining = limits.max_prompt_tokens
    per_unit: list[int] = []
    for unit in units:
        by_context = unit_limit is not None and (remaining is None or unit_limit < remaining)
        found = unit_limit if by_context else remaining
        limit = UNBOUNDED if found is None else found
        over = Over(by_context, limits)
        used = None
        if unit.chat is not None and unit.chat.kind == "score":
            # A scored pair: the template if the upstream uses it (vLLM: only one given with
            # --chat-template, never the tokenizer's own), else the pair as it is; the larger.
            used = fields_tokens(unit, how, limit, over)
            if template is not None and how.chat_template != "auto":
                used = max(used, _rendered(unit, how, template, limit, over, refuse=False) or 0)
        elif unit.chat is not None and template is not None:
            used = _rendered(unit, how, template, limit, over)
        if used is None:
            used = fields_tokens(unit, how, limit, over)
            loops = unit.loops
            if loops is not None and template is not None:
                # No render (or none modelled: the Responses API's input, which vLLM renders
                # with the template too): the template's own text, bounded from its source.
                used += template_literal_tokens(template[0], how.counter, loops)
                if used > limit:
                    raise over(unit.path)
        per_unit.append(used)
        if remaining is not None:
            remaining -= used
    return per_unit


def _lower_bound_over(unit: PromptUnit, counter: TokenCounter, fixed: int, limit: int) -> bool:
    """Whether the unit's strings alone have more tokens than ``limit - fixed`` (cheap bounds)."""
    left = limit - fixed
    if left < 0:
        return True
    texts = [text for _, text in unit.texts]
    texts.extend(arg.raw for arg in unit.arguments)
    if not texts or not counter.byte_bounds:
        return False
    if max(map(len, texts)) > counter.max_token_bytes * left:
        return True
    return counter.lower_bound_of_sum(texts, enough=left) > left


def _rendered(
    unit: PromptUnit,
    how: PromptCounting,
    template: ChatTemplate,
    limit: int,
    over: Over,
    *,
    refuse: bool = True,
) -> int | None:
    """The unit's exact count from the upstream's template (None: fall back to the bound);
    with ``refuse``, the upstream's own refusal of the conversation is raised."""
    assert unit.chat is not None
    fixed = unit.token_ids + unit.media + unit.specials
    if unit.template is not None:
        fixed += template_tokens(unit, how, limit + 1)
    if _lower_bound_over(unit, how.counter, fixed, limit):
        raise over(unit.path)
    text, special = template
    try:
        outcome = render_count(
            unit.chat,
            text,
            special,
            how.flavours,
            how.counter,
            limit - fixed,
            how.sandbox,
            how.units.max_json_depth,
            how.content_format,
        )
    except LimitExceeded as exc:
        if exc.code == "prompt_tokens_exceeded":
            raise over(unit.path) from None
        raise
    if outcome.tokens is None:
        if outcome.raised is not None and refuse:
            raise outcome.raised  # the template refuses this input, as it would upstream
        return None
    return outcome.tokens + fixed
