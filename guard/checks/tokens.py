"""The tokens check: prompt tokens under the cap, a bounded output cap on every generation, and
each prompt plus its output within the context length.

1. Output: every output-cap field present (``max_tokens``, ``max_completion_tokens``,
   ``n_predict``, ``max_new_tokens``, ``max_output_tokens``) must be within
   ``max_output_tokens`` (else ``max_tokens_exceeded``, or clamped, as the policy says); a
   generation request with none gets ``default_max_tokens`` injected (a mutation).
2. Prompt: what the upstream will tokenize (:mod:`guard.checks._text`: every string a chat
   template can render, structured values as indent-4 JSON, the template's markup, media token
   estimates, special tokens; :mod:`guard.checks._score`: every query-document pair of vLLM's
   ``/score`` and ``/rerank``), summed over the request, must have at most
   ``max_prompt_tokens`` tokens, and each sequence at most ``context_length`` minus the output
   cap. Cheapest first:

   a. the byte bound: UTF-8 bytes bound the tokens of byte-level BPE, so a prompt whose bytes
      (indent-4 JSON for structured values, overheads added) fit is admitted untokenized
      (unless ``exact_costs``, which defaults to true when the upstream's chat template is
      known);
   b. a lower bound of the strings' tokens over the limit refuses without rendering anything;
   c. a chat with the upstream's chat template known (``limits.tokens.chat_template``, or the
      request's own when the policy accepts it) is rendered as the upstream renders it and
      counted (:mod:`guard.checks._render`): exact; each upstream's render is a candidate and
      the largest wins; when every render fails because the upstream refuses the conversation
      itself (the template's ``raise_exception``, vLLM's own checks), that is the answer;
   d. otherwise each field is counted with an early stop at the tokens left
      (:meth:`guard.tokens._counter.TokenCounter.measure`), plus the overheads, plus, when the
      template is known but no render succeeded, its literal text
      (:mod:`guard.checks._template_bound`): the fallback bound.

Costs reported: ``prompt_tokens`` (an upper bound of the upstream's ``usage.prompt_tokens``;
``prompt_tokens_exact`` is 1 when it came from counting rather than from bytes), ``media_tokens``
(the media estimates within it), ``output_tokens`` (the cap per sequence), ``sequences``,
``output_tokens_reserved`` ((cap + llama-cpp-python's known overshoot,
:data:`OUTPUT_OVERSHOOT`) x sequences) and ``tokens_reserved`` (prompt + reserved output:
what a token rate limiter charges before forwarding).

Codes: ``max_tokens_exceeded``, ``prompt_tokens_exceeded``, ``context_length_exceeded``,
``output_cap_bypass`` (:mod:`guard.checks._logit_bias`, in front of all but vLLM),
``json_depth_exceeded`` (tool-call arguments nested too deep to parse), and the sandbox's
``chat_template_*`` limits and ``deadline_exceeded`` from a render.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from guard.checks._fields import (
    INJECT_FIELD,
    fmt_path,
    lax_int,
    output_fields,
    requested_output,
    sequences_per_prompt,
)
from guard.checks._jsonsize import indent4_size, indent4_text
from guard.checks._logit_bias import check_llama_cpp_logit_bias
from guard.checks._placeholders import bound_expansion, parse_source
from guard.checks._render import Flavour, render_count
from guard.checks._result import CheckResult, Mutation, pure_check
from guard.checks._score import score_units
from guard.checks._template_bound import template_literal_bytes, template_literal_tokens
from guard.checks._template_source import load_chat_template, tokenizer_special_tokens
from guard.checks._text import ChatInput, Counting, PromptUnit, prompt_units
from guard.errors import LimitExceeded
from guard.policy._models import Policy, TokensPolicy
from guard.request_view import Endpoint, RequestView
from guard.tokens import TokenCounter, get_counter

__all__ = ["OUTPUT_OVERSHOOT", "check_tokens", "counting_for", "render_flavours"]

# Output tokens an upstream may generate past the cap, per sequence. llama-cpp-python 0.3.36
# (Llama._create_completion) skips its max_tokens test while the text ends inside a UTF-8
# character (`multibyte_fix`): up to 3 more tokens for a 4-byte character cut by the cap (a
# grammar of 4-byte characters: completion_tokens 8 for max_tokens 5). vLLM stops at the cap.
# Reserved in front of llama-cpp-python; the reconcile charges what `usage` says.
OUTPUT_OVERSHOOT = 3
# Tokens added to each field counted inside a template's text (the fallback bound): a token
# merged across its edges.
_EDGE = 1


@pure_check
def check_tokens(view: RequestView, policy: Policy) -> CheckResult | None:
    body = view.obj
    if body is None:
        return None
    tokens = policy.limits.tokens
    endpoint = view.endpoint
    mutations: list[Mutation] = []
    output = _output_cap(body, endpoint, policy, mutations)
    counter = get_counter(tokens.tokenizer)
    if policy.upstream_kind != "vllm" and output is not None:
        # llama-cpp-python's (or an upstream not known yet: it may be one).
        check_llama_cpp_logit_bias(body, counter)
    context = _Context(policy, counter, counting_for(policy, counter), output)
    if endpoint in ("score", "rerank"):
        units = score_units(body, endpoint, context.counting)
    else:
        units = prompt_units(body, endpoint, context.counting)
    prompt, exact, per_unit = _count(units, context, body)
    if output is not None and output.to_window:
        output = _clamped_to_window(output, per_unit, tokens, mutations)
    sequences = 0
    reserved = 0
    if output is not None:
        per_prompt = sequences_per_prompt(body)
        prompts = len(units) if endpoint in ("completions", "other") else 1
        sequences = per_prompt * max(1, prompts)
        if output.implicit:
            reserved = _window_remainder(per_unit, prompts, per_prompt, tokens.context_length)
        else:
            overshoot = OUTPUT_OVERSHOOT if policy.upstream_kind == "llama_cpp" else 0
            reserved = (output.tokens + overshoot) * sequences
    costs = {
        "prompt_tokens": prompt,
        "prompt_tokens_exact": int(exact),
        "output_tokens": 0 if output is None or output.implicit else output.tokens,
        "sequences": sequences,
        "output_tokens_reserved": reserved,
        "tokens_reserved": prompt + reserved,
    }
    if output is not None and output.implicit:
        costs["output_tokens_implicit"] = 1
    media = sum(unit.media for unit in units)
    if media:
        costs["media_tokens"] = media
    return CheckResult.passed(costs, tuple(mutations))


def _clamped_to_window(
    output: _Output, per_unit: list[int], tokens: TokensPolicy, mutations: list[Mutation]
) -> _Output:
    """The fields over the window clamped to what it leaves beside the longest prompt."""
    assert tokens.context_length is not None  # to_window is only set with a window
    left = max(1, tokens.context_length - max(per_unit, default=0))
    mutations.extend(Mutation((name,), left, "max_output_tokens") for name in output.to_window)
    return _Output(left)


def _window_remainder(
    per_unit: list[int], prompts: int, per_prompt: int, context_length: int | None
) -> int:
    """The output a request without a cap may generate: what the window leaves after each
    prompt, per sequence (0 when no window is known: the limiter settles from ``usage``)."""
    if context_length is None:
        return 0
    if len(per_unit) == prompts:
        return per_prompt * sum(max(0, context_length - used) for used in per_unit)
    # One conversation counted as a whole (chat): one prompt.
    return per_prompt * max(0, context_length - sum(per_unit))


def render_flavours(policy: Policy) -> tuple[Flavour, ...]:
    """The upstreams whose renders are modelled: ``render_like`` when the policy sets it, else
    the upstream kind in force alone (both while it is not known)."""
    tokens = policy.limits.tokens
    kind = policy.upstream_kind
    if "render_like" in tokens.model_fields_set or kind == "other":
        return tokens.render_like
    return (kind,)


_COUNTING: dict[int, tuple[TokensPolicy, str, Counting]] = {}


def counting_for(policy: Policy, counter: TokenCounter) -> Counting:
    """The gatherer's settings for a policy (built once per policy)."""
    tokens = policy.limits.tokens
    kind = policy.upstream_kind
    cached = _COUNTING.get(id(tokens))
    if cached is not None and cached[0] is tokens and cached[1] == kind:
        return cached[2]
    counting = Counting(
        per_message=tokens.per_message_tokens,
        per_request=tokens.per_request_tokens,
        tools=tokens.tools_tokens,
        image=tokens.tokens_per_image,
        video_frame=tokens.tokens_per_video_frame,
        audio=tokens.tokens_per_audio,
        media_as_text="llama_cpp" in render_flavours(policy),
        special_tokens=counter.special_tokens,
        max_json_depth=policy.limits.json_.max_depth,
    )
    if len(_COUNTING) >= 64:
        _COUNTING.clear()
    _COUNTING[id(tokens)] = (tokens, kind, counting)
    return counting


@dataclass(frozen=True, slots=True)
class _Output:
    """The output cap of each sequence: ``tokens`` set by the request (or injected), or, when
    ``implicit``, none: the upstream generates to the end of the window (``tokens`` is then
    the least it needs beside the prompt, 1). ``to_window``: fields over the window-derived
    cap, clamped once the prompt is counted to what the window leaves beside it."""

    tokens: int
    implicit: bool = False
    to_window: tuple[str, ...] = ()


@dataclass(slots=True)
class _Context:
    policy: Policy
    counter: TokenCounter
    counting: Counting
    output: _Output | None


def _output_cap(
    body: dict[str, Any], endpoint: Endpoint, policy: Policy, mutations: list[Mutation]
) -> _Output | None:
    """The output cap per sequence after clamping or injection; None when nothing is
    generated."""
    tokens = policy.limits.tokens
    cap = tokens.output_limit
    to_window: list[str] = []
    for name in output_fields(endpoint):
        value = lax_int(body.get(name))
        if value is None or (value > 0 and (cap is None or value <= cap)):
            continue
        # 0 and negative values are no cap at all to llama-cpp-python (it generates to the
        # end of its context) and -1 is "unlimited" to llama.cpp's n_predict; vLLM refuses them.
        if tokens.over_max_output == "clamp" and cap is not None:
            if tokens.max_output_tokens is None:
                to_window.append(name)  # to what the window leaves, once the prompt is known
            else:
                mutations.append(Mutation((name,), cap, "max_output_tokens"))
            continue
        shown = f"{value} (unlimited)" if value <= 0 else str(value)
        if value <= 0:
            limit = "it must be at least 1"
        elif tokens.max_output_tokens is None:
            limit = f"the context window is {tokens.context_length} tokens, so the limit is {cap}"
        else:
            limit = f"the limit is {cap}"
        raise LimitExceeded("max_tokens_exceeded", f"{name} is {shown}; {limit}", param=name)
    requested = requested_output(body, endpoint)
    inject = INJECT_FIELD.get(endpoint)
    if to_window:
        return _Output(1, to_window=tuple(to_window))
    if requested is not None:
        value = requested[1]
        output = value if cap is None else (min(value, cap) if value > 0 else cap)
        if (
            inject is not None
            and lax_int(body.get(inject)) is None
            and policy.upstream_kind == "llama_cpp"
        ):
            # Only another field caps the output (max_completion_tokens, n_predict,
            # max_new_tokens): llama-cpp-python reads max_tokens alone, and without it
            # generates to the end of its context. vLLM reads max_completion_tokens itself.
            mutations.append(Mutation((inject,), output, "max_tokens_missing"))
        return _Output(output)
    if inject is None:
        return None
    if tokens.default_max_tokens is not None:
        mutations.append(Mutation((inject,), tokens.default_max_tokens, "default_max_tokens"))
        return _Output(tokens.default_max_tokens)
    return _Output(1, implicit=True)


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
    ctx: _Context,
    unit_limit: int | None,
    template: str | None,
    body: dict[str, Any],
) -> tuple[int, list[int]] | None:
    """The UTF-8 byte count (plus ids, overheads and the chat template's own text), in all and
    per unit, when it proves every limit holds."""
    policy = ctx.policy
    total_limit = policy.limits.tokens.max_prompt_tokens
    depth = policy.limits.templates.max_depth
    # Without a limit a template's expansion is weighed up to what the templates check allows.
    expansion_cap = policy.limits.templates.max_expansion_chars * 4 + 1
    raw = ctx.counting.media_as_text  # llama-cpp-python prints arguments as sent
    parsed = "vllm" in render_flavours(policy)
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
        cap = expansion_cap if found is None else found + 1
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
    units: list[PromptUnit], ctx: _Context, body: dict[str, Any]
) -> tuple[int, bool, list[int]]:
    """(prompt tokens, counted, each unit's tokens) for ``units``, or the first limit crossed
    as LimitExceeded."""
    tokens = ctx.policy.limits.tokens
    context = tokens.context_length
    output = ctx.output.tokens if ctx.output is not None else 0
    unit_limit = None if context is None else context - output
    template = _template_for(body, ctx.policy)
    exact = tokens.exact_costs if tokens.exact_costs is not None else template is not None
    if ctx.counter.byte_bounds and not exact:
        bound = _upper_bound(
            units, ctx, unit_limit, None if template is None else template[0], body
        )
        if bound is not None:
            return bound[0], False, bound[1]
    remaining = tokens.max_prompt_tokens
    total = 0
    per_unit: list[int] = []
    for unit in units:
        by_context = unit_limit is not None and (remaining is None or unit_limit < remaining)
        found = unit_limit if by_context else remaining
        limit = _UNBOUNDED if found is None else found
        over = _Over(by_context, tokens, ctx.output)
        used = None
        if unit.chat is not None and unit.chat.kind == "score":
            # A scored pair: the template if the upstream uses it (vLLM: only one given with
            # --chat-template, never the tokenizer's own), else the pair as it is; the larger.
            used = _counted(unit, ctx, limit, over)
            if template is not None and tokens.chat_template != "auto":
                used = max(used, _rendered(unit, ctx, template, limit, over, refuse=False) or 0)
        elif unit.chat is not None and template is not None:
            used = _rendered(unit, ctx, template, limit, over)
        if used is None:
            used = _counted(unit, ctx, limit, over)
            sizing = unit.chat or _responses_chat(unit, body)
            if sizing is not None and template is not None:
                # No render (or none modelled: the Responses API's input, which vLLM renders
                # with the template too): the template's own text, bounded from its source.
                used += template_literal_tokens(template[0], ctx.counter, sizing)
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
    tokens: TokensPolicy
    output: _Output | None

    def __call__(self, path: tuple[str | int, ...]) -> LimitExceeded:
        param = fmt_path(path) or None
        if self.by_context:
            if self.output is None or self.output.implicit:
                what = "the prompt leaves no room for output within"
            else:
                what = f"the prompt plus the output cap ({self.output.tokens} tokens) exceeds"
            return LimitExceeded(
                "context_length_exceeded",
                f"{what} the context length of {self.tokens.context_length} tokens; shorten "
                "the prompt or lower max_tokens",
                param=param,
            )
        return LimitExceeded(
            "prompt_tokens_exceeded",
            f"the prompt has more tokens than the limit of {self.tokens.max_prompt_tokens}; "
            "shorten it",
            param=param,
        )


def _template_for(
    body: dict[str, Any], policy: Policy
) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """The chat template the upstream renders this request with, and its special tokens: the
    request's own when the policy accepts request templates, else the configured one."""
    tokens = policy.limits.tokens
    configured = load_chat_template(tokens.chat_template, tokens.tokenizer)
    if configured is not None:
        special = configured.special_tokens
    else:  # a request's template alone: the tokenizer's tokens all the same
        special = tokenizer_special_tokens(tokens.tokenizer) or ()
    if policy.limits.templates.allow_request_chat_template:
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
    ctx: _Context,
    template: tuple[str, tuple[tuple[str, str], ...]],
    limit: int,
    over: _Over,
    *,
    refuse: bool = True,
) -> int | None:
    """The unit's exact count from the upstream's template (None: fall back to the bound);
    with ``refuse``, the upstream's own refusal of the conversation is raised."""
    assert unit.chat is not None
    policy = ctx.policy
    tokens = policy.limits.tokens
    fixed = unit.token_ids + unit.media + unit.specials
    if unit.template is not None:
        fixed += _template_tokens(unit, ctx, limit + 1)
    if _lower_bound_over(unit, ctx.counter, fixed, limit):
        raise over(unit.path)
    text, special = template
    try:
        outcome = render_count(
            unit.chat,
            text,
            special,
            render_flavours(policy),
            ctx.counter,
            limit - fixed,
            policy.limits.templates.chat_template,
            policy.limits.json_.max_depth,
            tokens.content_format,
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


def _counted(unit: PromptUnit, ctx: _Context, limit: int, over: _Over) -> int:
    """The fallback bound of one unit: each field counted exactly, plus the overheads."""
    counter = ctx.counter
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
    flavours = render_flavours(ctx.policy)
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
        used += _template_tokens(unit, ctx, max(limit - used, 0) + 1)
        if used > limit:
            raise over(("prompt_template",))
    return used


def _template_tokens(unit: PromptUnit, ctx: _Context, cap: int) -> int:
    """A bound on the tokens of the unit's expanded prompt template, literal runs counted
    (short ones weighed by their bytes)."""
    counter = ctx.counter

    def weigh(text: str) -> int:
        size = _utf8_len(text) if len(text) <= _SMALL_RUN else None
        if size is not None and size <= _SMALL_RUN and counter.byte_bounds:
            return size
        return counter.measure(text, cap, exact=True).tokens

    return _template_size(unit, weigh, ctx.policy.limits.templates.max_depth, cap)


def _measure(
    counter: TokenCounter, text: str, left: int, path: tuple[str | int, ...], over: _Over
) -> int:
    if left < 0:
        raise over(path)
    stats = counter.measure(text, left, exact=True)
    if not stats.within_limit:
        raise over(path)
    return stats.tokens


def _measure_json(
    counter: TokenCounter, value: Any, left: int, path: tuple[str | int, ...], over: _Over
) -> int:
    """Tokens of ``value`` as indent-4 JSON, built only when its size allows it to fit."""
    if left < 0:
        raise over(path)
    # Tokens are at most max_token_bytes long (for other tokenizers, 64 bytes is assumed).
    most = max(counter.max_token_bytes, 64) * left
    if indent4_size(value, most) > most:
        raise over(path)
    return _measure(counter, indent4_text(value), left, path, over)
