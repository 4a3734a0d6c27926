"""A request's prompt counted: what the upstream will tokenize, summed over its sequences, held
to the prompt cap and, sequence by sequence, to the context window beside the output.

:func:`count_prompt` is the one call. The sequences are gathered first (:mod:`._units`, and
:mod:`._score` for vLLM's ``/score`` and ``/rerank``); then, cheapest first:

a. the byte bound: UTF-8 bytes bound the tokens of byte-level BPE, so a prompt whose bytes
   (indent-4 JSON for structured values, overheads added) fit is admitted untokenized (unless
   ``exact``, which defaults to true when the upstream's chat template is known);
b. a lower bound of the strings' tokens over the limit refuses without rendering anything;
c. a chat with the upstream's chat template known (configured, or the request's own when the
   policy accepts it) is rendered as the upstream renders it and counted (:mod:`._render`):
   exact; each upstream's render is a candidate and the largest wins; when every render fails
   because the upstream refuses the conversation itself (the template's ``raise_exception``,
   vLLM's own checks), that is the answer;
d. otherwise each field is counted with an early stop at the tokens left
   (:meth:`guard.tokens.TokenCounter.measure`), plus the overheads, plus, when the template is
   known but no render succeeded, its literal text (:mod:`._template_bound`): the fallback
   bound.

The first limit crossed raises ``prompt_tokens_exceeded`` or ``context_length_exceeded``; a
render can raise the sandbox's ``chat_template_*`` limits and ``deadline_exceeded``, tool-call
arguments nested too deep ``json_depth_exceeded``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from guard.errors import LimitExceeded
from guard.jinja import ChatTemplateLimits
from guard.prompt._jsonsize import indent4_size, indent4_text
from guard.prompt._placeholders import bound_expansion, parse_source
from guard.prompt._render import Flavour, render_count
from guard.prompt._score import score_units
from guard.prompt._template_bound import template_literal_bytes, template_literal_tokens
from guard.prompt._template_source import load_chat_template, tokenizer_special_tokens
from guard.prompt._units import ChatInput, Counting, PromptUnit, prompt_units
from guard.request import Path, RequestView, fmt_path
from guard.tokens import TokenCounter

__all__ = ["PromptCount", "PromptCounting", "PromptLimits", "count_prompt"]

# Tokens added to each field counted inside a template's text (the fallback bound): a token
# merged across its edges.
_EDGE = 1


@dataclass(frozen=True, slots=True)
class PromptCounting:
    """How prompts are counted (a policy's ``limits.tokens`` and ``limits.templates``, built once
    per policy): the tokenizer, what the gatherer adds (:class:`Counting`), the upstreams whose
    renders are modelled, and the chat template."""

    counter: TokenCounter
    units: Counting
    flavours: tuple[Flavour, ...]
    chat_template: str | None  # the configured template: a file, ``auto``, or None
    tokenizer: str
    request_templates: bool  # the request's own chat template is the one rendered
    exact: bool | None  # count exactly even when the bytes fit (None: when a template is known)
    content_format: str
    sandbox: ChatTemplateLimits
    template_depth: int
    expansion_cap: int  # a prompt template's weight, at most, without a token limit


@dataclass(frozen=True, slots=True)
class PromptLimits:
    """What a prompt is held to: ``max_prompt_tokens`` over the request, and each sequence to
    ``context_length`` beside ``output`` tokens (the output cap; 1 when the upstream generates to
    the end of the window, ``output_capped`` false; 0 when nothing is generated)."""

    max_prompt_tokens: int | None
    context_length: int | None
    output: int = 0
    output_capped: bool = False


@dataclass(frozen=True, slots=True)
class PromptCount:
    """The prompt's tokens in all and per sequence; ``exact``: counted rather than bounded by
    bytes; ``media``: the media estimates within them."""

    tokens: int
    exact: bool
    per_unit: list[int]
    media: int


def count_prompt(view: RequestView, how: PromptCounting, limits: PromptLimits) -> PromptCount:
    """The prompt of ``view`` counted (module docstring), or the first limit crossed as
    :class:`~guard.errors.LimitExceeded`."""
    body = view.obj or {}
    endpoint = view.endpoint
    if endpoint in ("score", "rerank"):
        units = score_units(body, endpoint, how.units)
    else:
        units = prompt_units(body, endpoint, how.units)
    tokens, exact, per_unit = _count(units, how, limits, body)
    return PromptCount(tokens, exact, per_unit, sum(unit.media for unit in units))


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


# Literal runs of a prompt template at most this long are weighed by their bytes (a sound upper
# bound on their tokens), so a template of many tiny runs costs few tokenizer calls.
_SMALL_RUN = 64


def _template_size(unit: PromptUnit, weigh: Callable[[str], int], depth: int, cap: int) -> int:
    """An upper bound on the weight of the unit's expanded prompt template (0 without one)."""
    if unit.template is None:
        return 0
    template, variables = unit.template
    sources = {name: parse_source(value, weigh) for name, value in variables.items()}
    bound = bound_expansion(parse_source(template, weigh), sources, depth, cap)
    if bound.too_deep is not None:
        # Refused by the templates check; counted here as its text once.
        return min(cap, weigh(template) + sum(weigh(v) for v in variables.values()))
    return bound.size


def _fixed(unit: PromptUnit) -> int:
    """The unit's tokens that are not text: ids, markup, media, special tokens."""
    return unit.token_ids + unit.overhead + unit.media + unit.specials


# A limit no count reaches: a prompt held only by its own size (no window, no cap).
_UNBOUNDED = 1 << 62


def _least(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def _upper_bound(
    units: list[PromptUnit],
    how: PromptCounting,
    unit_limit: int | None,
    total_limit: int | None,
    template: str | None,
    body: dict[str, Any],
) -> tuple[int, list[int]] | None:
    """The UTF-8 byte count (plus ids, overheads and the chat template's own text), in all and
    per unit, when it proves every limit holds."""
    depth = how.template_depth
    raw = how.units.media_as_text  # llama-cpp-python prints arguments as sent
    parsed = "vllm" in how.flavours
    total = 0
    sizes: list[int] = []
    for unit in units:
        found = _least(unit_limit, None if total_limit is None else total_limit - total)
        limit = _UNBOUNDED if found is None else found
        size = _fixed(unit)
        for _, text in unit.texts:
            if len(text) > limit:  # bytes >= characters: no proof from bytes
                return None
            size += _utf8_len(text)
            if size > limit:  # already past: no proof, whatever follows
                return None
        for _, value in unit.values:
            size += indent4_size(value, limit - size)
            if size > limit:
                return None
        for arg in unit.arguments:
            weight = _utf8_len(arg.raw) if raw else 0
            if parsed:
                weight = max(weight, indent4_size(arg.parsed, limit - size))
            size += weight
            if size > limit:
                return None
        cap = how.expansion_cap if found is None else found + 1
        size += _template_size(unit, _utf8_len, depth, cap)
        sizing = unit.chat or _responses_chat(unit, body)
        if sizing is not None and template is not None:
            size += template_literal_bytes(template, sizing)
        if size > limit:
            return None
        total += size
        sizes.append(size)
    return total, sizes


def _count(
    units: list[PromptUnit], how: PromptCounting, limits: PromptLimits, body: dict[str, Any]
) -> tuple[int, bool, list[int]]:
    """(prompt tokens, counted, each unit's tokens) for ``units``, or the first limit crossed
    as LimitExceeded."""
    context = limits.context_length
    unit_limit = None if context is None else context - limits.output
    template = _template_for(body, how)
    exact = how.exact if how.exact is not None else template is not None
    if how.counter.byte_bounds and not exact:
        bound = _upper_bound(
            units,
            how,
            unit_limit,
            limits.max_prompt_tokens,
            None if template is None else template[0],
            body,
        )
        if bound is not None:
            return bound[0], False, bound[1]
    remaining = limits.max_prompt_tokens
    total = 0
    per_unit: list[int] = []
    for unit in units:
        by_context = unit_limit is not None and (remaining is None or unit_limit < remaining)
        found = unit_limit if by_context else remaining
        limit = _UNBOUNDED if found is None else found
        over = _Over(by_context, limits)
        used = None
        if unit.chat is not None and unit.chat.kind == "score":
            # A scored pair: the template if the upstream uses it (vLLM: only one given with
            # --chat-template, never the tokenizer's own), else the pair as it is; the larger.
            used = _counted(unit, how, limit, over)
            if template is not None and how.chat_template != "auto":
                used = max(used, _rendered(unit, how, template, limit, over, refuse=False) or 0)
        elif unit.chat is not None and template is not None:
            used = _rendered(unit, how, template, limit, over)
        if used is None:
            used = _counted(unit, how, limit, over)
            sizing = unit.chat or _responses_chat(unit, body)
            if sizing is not None and template is not None:
                # No render (or none modelled: the Responses API's input, which vLLM renders
                # with the template too): the template's own text, bounded from its source.
                used += template_literal_tokens(template[0], how.counter, sizing)
                if used > limit:
                    raise over(unit.path)
        total += used
        per_unit.append(used)
        if remaining is not None:
            remaining -= used
    return total, True, per_unit


def _responses_chat(unit: PromptUnit, body: dict[str, Any]) -> ChatInput | None:
    """The Responses API's input items as a conversation, to size the template's loops."""
    if not unit.templated or unit.chat is not None:
        return None
    items = body.get("input")
    return ChatInput(items if isinstance(items, list) else [items], body)


@dataclass(frozen=True, slots=True)
class _Over:
    """Raises the right code for the limit a unit is held to."""

    by_context: bool
    limits: PromptLimits

    def __call__(self, path: Path) -> LimitExceeded:
        param = fmt_path(path) or None
        limits = self.limits
        if self.by_context:
            if not limits.output_capped:
                what = "the prompt leaves no room for output within"
            else:
                what = f"the prompt plus the output cap ({limits.output} tokens) exceeds"
            return LimitExceeded(
                "context_length_exceeded",
                f"{what} the context length of {limits.context_length} tokens; shorten "
                "the prompt or lower max_tokens",
                param=param,
            )
        return LimitExceeded(
            "prompt_tokens_exceeded",
            f"the prompt has more tokens than the limit of {limits.max_prompt_tokens}; shorten it",
            param=param,
        )


def _template_for(
    body: dict[str, Any], how: PromptCounting
) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """The chat template the upstream renders this request with, and its special tokens: the
    request's own when the policy accepts request templates, else the configured one."""
    configured = load_chat_template(how.chat_template, how.tokenizer)
    if configured is not None:
        special = configured.special_tokens
    else:  # a request's template alone: the tokenizer's tokens all the same
        special = tokenizer_special_tokens(how.tokenizer) or ()
    if how.request_templates:
        kwargs = body.get("chat_template_kwargs")
        for source in (
            body.get("chat_template"),
            kwargs.get("chat_template") if isinstance(kwargs, dict) else None,
        ):
            if isinstance(source, str):
                return source, special
    if configured is None:
        return None
    return configured.source_for(bool(body.get("tools"))), special


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
    template: tuple[str, tuple[tuple[str, str], ...]],
    limit: int,
    over: _Over,
    *,
    refuse: bool = True,
) -> int | None:
    """The unit's exact count from the upstream's template (None: fall back to the bound);
    with ``refuse``, the upstream's own refusal of the conversation is raised."""
    assert unit.chat is not None
    fixed = unit.token_ids + unit.media + unit.specials
    if unit.template is not None:
        fixed += _template_tokens(unit, how, limit + 1)
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


def _counted(unit: PromptUnit, how: PromptCounting, limit: int, over: _Over) -> int:
    """The fallback bound of one unit: each field counted exactly, plus the overheads."""
    counter = how.counter
    used = _fixed(unit)
    if used > limit:
        raise over(unit.path)
    if len(unit.texts) > 1:
        # Many short texts (400 messages, say) are refused from one bound over them all
        # before any is measured alone (a tokenizer call or several C passes each).
        texts = [text for _, text in unit.texts]
        if used + counter.lower_bound_of_sum(texts, enough=limit - used) > limit:
            raise over(unit.path)
    edge = _EDGE if unit.templated else 0
    for path, text in unit.texts:
        used += _measure(counter, text, limit - used - edge, path, over) + edge
    for path, value in unit.values:
        used += _measure_json(counter, value, limit - used - edge, path, over) + edge
    flavours = how.flavours
    for arg in unit.arguments:
        weight = 0
        left = limit - used - edge
        if "llama_cpp" in flavours:
            weight = _measure(counter, arg.raw, left, arg.path, over)
        if "vllm" in flavours:
            weight = max(weight, _measure_json(counter, arg.parsed, left, arg.path, over))
        used += weight + edge
    if used > limit:
        raise over(unit.path)
    if unit.template is not None:
        used += _template_tokens(unit, how, max(limit - used, 0) + 1)
        if used > limit:
            raise over(("prompt_template",))
    return used


def _template_tokens(unit: PromptUnit, how: PromptCounting, cap: int) -> int:
    """A bound on the tokens of the unit's expanded prompt template, literal runs counted
    (short ones weighed by their bytes)."""
    counter = how.counter

    def weigh(text: str) -> int:
        size = _utf8_len(text) if len(text) <= _SMALL_RUN else None
        if size is not None and size <= _SMALL_RUN and counter.byte_bounds:
            return size
        return counter.measure(text, cap, exact=True).tokens

    return _template_size(unit, weigh, how.template_depth, cap)


def _measure(counter: TokenCounter, text: str, left: int, path: Path, over: _Over) -> int:
    if left < 0:
        raise over(path)
    stats = counter.measure(text, left, exact=True)
    if not stats.within_limit:
        raise over(path)
    return stats.tokens


def _measure_json(counter: TokenCounter, value: Any, left: int, path: Path, over: _Over) -> int:
    """Tokens of ``value`` as indent-4 JSON, built only when its size allows it to fit."""
    if left < 0:
        raise over(path)
    # Tokens are at most max_token_bytes long (for other tokenizers, 64 bytes is assumed).
    most = max(counter.max_token_bytes, 64) * left
    if indent4_size(value, most) > most:
        raise over(path)
    return _measure(counter, indent4_text(value), left, path, over)
