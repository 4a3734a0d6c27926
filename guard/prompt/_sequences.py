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
from guard.prompt._fields import fields_tokens
from guard.prompt._placeholders import expansion_tokens
from guard.prompt._render import render_count
from guard.prompt._template_bound import template_literal_tokens
from guard.prompt._template_source import ChatTemplate
from guard.prompt._terms import UNBOUNDED, Over, PromptCounting, PromptLimits
from guard.prompt._units import PromptUnit

__all__ = ["count_sequences"]


def count_sequences(
    units: list[PromptUnit],
    how: PromptCounting,
    limits: PromptLimits,
    template: ChatTemplate | None,
) -> list[int]:
    """Each unit's tokens, or the first limit crossed as LimitExceeded."""
    unit_limit = limits.per_unit
    remaining = limits.max_prompt_tokens
    counter = how.counter
    per_unit: list[int] = []
    for unit in units:
        by_context = unit_limit is not None and (remaining is None or unit_limit < remaining)
        found = unit_limit if by_context else remaining
        limit = UNBOUNDED if found is None else found
        over = Over(by_context, limits)
        expansion = 0  # the prompt template's tokens, at most limit + 1
        if unit.template is not None:
            expansion = expansion_tokens(*unit.template, counter, how.template_depth, limit + 1)
        # A scored pair counts both ways, the larger winning: the pair as it is, and the
        # template if the upstream uses it (vLLM: only one given with --chat-template, never
        # the tokenizer's own). A conversation is rendered when its template is known.
        scored = unit.chat is not None and unit.chat.kind == "score"
        used = fields_tokens(unit, how, expansion, limit, over) if scored else None
        if (
            unit.chat is not None
            and template is not None
            and not (scored and how.chat_template == "auto")
        ):
            # Refused without rendering when the strings alone have more tokens than what is
            # left beside the ids, media, special tokens and prompt template (cheap bounds).
            fixed = unit.token_ids + unit.media + unit.specials + expansion
            left = limit - fixed
            strings = [text for _, text in unit.texts]
            strings.extend(arg.raw for arg in unit.arguments)
            if left < 0 or (
                strings
                and counter.byte_bounds
                and (
                    max(map(len, strings)) > counter.max_token_bytes * left
                    or counter.lower_bound_of_sum(strings, enough=left) > left
                )
            ):
                raise over(unit.path)
            source, special = template
            try:
                outcome = render_count(
                    unit.chat,
                    source,
                    special,
                    how.flavours,
                    counter,
                    left,
                    how.sandbox,
                    how.units.max_json_depth,
                    how.content_format,
                )
            except LimitExceeded as exc:
                if exc.code == "prompt_tokens_exceeded":
                    raise over(unit.path) from None
                raise
            if outcome.tokens is None and outcome.raised is not None and not scored:
                raise outcome.raised  # the template refuses this input, as it would upstream
            rendered = None if outcome.tokens is None else outcome.tokens + fixed
            used = rendered if used is None else max(used, rendered or 0)
        if used is None:
            used = fields_tokens(unit, how, expansion, limit, over)
            loops = unit.loops
            if loops is not None and template is not None:
                # No render (or none modelled: the Responses API's input, which vLLM renders
                # with the template too): the template's own text, bounded from its source.
                used += template_literal_tokens(template[0], counter, loops)
                if used > limit:
                    raise over(unit.path)
        per_unit.append(used)
        if remaining is not None:
            remaining -= used
    return per_unit
