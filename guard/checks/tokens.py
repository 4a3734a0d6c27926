"""The tokens check: prompt tokens under the cap, a bounded output cap on every generation, and
each prompt plus its output within the context length.

1. Output: every output-cap field present (``max_tokens``, ``max_completion_tokens``,
   ``n_predict``, ``max_new_tokens``, ``max_output_tokens``) must be within
   ``max_output_tokens`` (else ``max_tokens_exceeded``, or clamped, as the policy says); a
   generation request with none gets ``default_max_tokens`` injected (a mutation).
2. Prompt: the texts of :mod:`guard.checks._text`, summed over the request, must have at most
   ``max_prompt_tokens`` tokens, and each sequence at most ``context_length`` minus the output
   cap. The byte length is a sound upper bound for byte-level BPE, so a prompt whose UTF-8 size
   is within the limits is never tokenized (unless ``exact_costs``); otherwise each text is
   counted with an early stop at the tokens left (:meth:`guard.tokens._counter.TokenCounter.measure`).

Costs reported: ``prompt_tokens`` (exact when ``prompt_tokens_exact`` is 1, else an upper
bound), ``output_tokens`` (the cap per sequence), ``sequences``, ``output_tokens_reserved``
(cap x sequences) and ``tokens_reserved`` (prompt + reserved output: what a token rate limiter
charges before forwarding).

Codes: ``max_tokens_exceeded``, ``prompt_tokens_exceeded``, ``context_length_exceeded``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from guard.checks._fields import (
    INJECT_FIELD,
    fmt_path,
    lax_int,
    output_fields,
    requested_output,
    sequences_per_prompt,
)
from guard.checks._placeholders import bound_expansion, parse_source
from guard.checks._result import CheckResult, Mutation, pure_check
from guard.checks._text import PromptUnit, prompt_units
from guard.errors import LimitExceeded
from guard.policy._models import Policy, TokensPolicy
from guard.request_view import Endpoint, RequestView
from guard.tokens import TokenCounter, get_counter

__all__ = ["check_tokens"]


@pure_check
def check_tokens(view: RequestView, policy: Policy) -> CheckResult | None:
    body = view.obj
    if body is None:
        return None
    tokens = policy.limits.tokens
    endpoint = view.endpoint
    mutations: list[Mutation] = []
    output = _output_cap(body, endpoint, tokens, mutations)
    units = prompt_units(body, endpoint, tokens.per_message_tokens)
    context = tokens.context_length
    unit_limit = None if context is None else context - (output or 0)
    counter = get_counter(tokens.tokenizer)
    depth = policy.limits.templates.max_depth
    prompt, exact = _count(units, counter, tokens, unit_limit, output, depth)
    sequences = 0
    if output is not None:
        prompts = len(units) if endpoint in ("completions", "other") else 1
        sequences = sequences_per_prompt(body) * max(1, prompts)
    reserved = (output or 0) * sequences
    costs = {
        "prompt_tokens": prompt,
        "prompt_tokens_exact": int(exact),
        "output_tokens": output or 0,
        "sequences": sequences,
        "output_tokens_reserved": reserved,
        "tokens_reserved": prompt + reserved,
    }
    return CheckResult.passed(costs, tuple(mutations))


def _output_cap(
    body: dict[str, Any], endpoint: Endpoint, tokens: TokensPolicy, mutations: list[Mutation]
) -> int | None:
    """The output cap per sequence after injection or clamping; None when nothing is generated."""
    cap = tokens.max_output_tokens
    for name in output_fields(endpoint):
        value = lax_int(body.get(name))
        if value is None or 0 <= value <= cap:
            continue
        if tokens.over_max_output == "clamp":
            mutations.append(Mutation((name,), cap, "max_output_tokens"))
            continue
        shown = f"{value} (unlimited)" if value < 0 else str(value)
        raise LimitExceeded(
            "max_tokens_exceeded", f"{name} is {shown}; the limit is {cap}", param=name
        )
    requested = requested_output(body, endpoint)
    if requested is not None:
        return min(max(requested[1], 0), cap) if requested[1] >= 0 else cap
    inject = INJECT_FIELD.get(endpoint)
    if inject is None:
        return None
    mutations.append(Mutation((inject,), tokens.default_max_tokens, "default_max_tokens"))
    return tokens.default_max_tokens


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


def _upper_bound(
    units: list[PromptUnit], total_limit: int, unit_limit: int | None, depth: int
) -> int | None:
    """The UTF-8 byte count (plus ids and overheads) when it proves every limit holds."""
    total = 0
    for unit in units:
        size = unit.token_ids + unit.overhead
        for _, text in unit.texts:
            if len(text) > total_limit:  # bytes >= characters: no proof from bytes
                return None
            size += _utf8_len(text)
            if total + size > total_limit:  # already past: no proof, whatever follows
                return None
        size += _template_size(unit, _utf8_len, depth, total_limit + 1)
        if unit_limit is not None and size > unit_limit:
            return None
        total += size
        if total > total_limit:
            return None
    return total


def _count(
    units: list[PromptUnit],
    counter: TokenCounter,
    tokens: TokensPolicy,
    unit_limit: int | None,
    output: int | None,
    depth: int,
) -> tuple[int, bool]:
    """(prompt tokens, exact) for ``units``, or the first limit crossed as LimitExceeded.

    "Exact" is the sum of each text's exact count; an expanded prompt template contributes an
    upper bound (each literal run counted as often as it can be expanded).
    """
    total_limit = tokens.max_prompt_tokens
    if counter.byte_bounds and not tokens.exact_costs:
        bound = _upper_bound(units, total_limit, unit_limit, depth)
        if bound is not None:
            return bound, False
    remaining = total_limit
    total = 0
    for unit in units:
        by_context = unit_limit is not None and unit_limit < remaining
        limit = unit_limit if by_context and unit_limit is not None else remaining
        used = unit.token_ids + unit.overhead
        if used > limit:
            raise _over(by_context, unit.path, tokens, output)
        if len(unit.texts) > 1:
            # Many short texts (400 messages, say) are refused from one bound over them all
            # before any is measured alone (a tokenizer call or several C passes each).
            texts = [text for _, text in unit.texts]
            at_least = used + counter.lower_bound_of_sum(texts, enough=limit - used)
            if at_least > limit:
                raise _over(by_context, unit.path, tokens, output)
        for path, text in unit.texts:
            stats = counter.measure(text, limit - used, exact=True)
            if not stats.within_limit:
                raise _over(by_context, path, tokens, output)
            used += stats.tokens
        if unit.template is not None:
            cap = max(limit - used, 0) + 1

            def weigh(text: str, cap: int = cap) -> int:
                size = _utf8_len(text) if len(text) <= _SMALL_RUN else None
                if size is not None and size <= _SMALL_RUN and counter.byte_bounds:
                    return size
                return counter.measure(text, cap, exact=True).tokens

            used += _template_size(unit, weigh, depth, cap)
            if used > limit:
                raise _over(by_context, ("prompt_template",), tokens, output)
        total += used
        remaining -= used
    return total, True


def _over(
    by_context: bool, path: tuple[str | int, ...], tokens: TokensPolicy, output: int | None
) -> LimitExceeded:
    param = fmt_path(path) or None
    if by_context:
        return LimitExceeded(
            "context_length_exceeded",
            f"the prompt plus the output cap ({output or 0} tokens) exceeds the context length "
            f"of {tokens.context_length} tokens; shorten the prompt or lower max_tokens",
            param=param,
        )
    return LimitExceeded(
        "prompt_tokens_exceeded",
        f"the prompt has more tokens than the limit of {tokens.max_prompt_tokens}; shorten it",
        param=param,
    )
