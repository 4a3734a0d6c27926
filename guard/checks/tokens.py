"""The tokens check: prompt tokens under the cap, a bounded output cap on every generation, and
each prompt plus its output within the context length; its limit set, ``limits.tokens``.

1. Output (:mod:`guard.checks._output`): every output-cap field present must be within
   ``max_output_tokens`` (else ``max_tokens_exceeded``, or clamped, as the policy says); a
   generation request with none gets ``default_max_tokens`` injected (a mutation).
2. In front of any upstream but vLLM, a ``logit_bias`` or a penalty that rewards repetition,
   which make llama-cpp-python generate past the cap, is refused
   (:mod:`guard.checks._cap_bypass`).
3. Prompt: the request's prompt counted once, by :func:`guard.prompt.count_prompt` (what the
   upstream will tokenize, summed over the request, at most ``max_prompt_tokens``, and each
   sequence at most ``context_length`` minus the output cap: a byte bound, the upstream's chat
   template rendered, or a bound counted field by field), with the policy's counting settings
   (:func:`prompt_counting`, built once per policy); when llama-cpp-python's log-probabilities
   echo the prompt, each sequence's exact count is asked for with it.
4. In front of llama-cpp-python, log-probabilities cost a vocabulary sort and a prefix
   detokenisation per position: held to ``max_logprob_work`` (:mod:`guard.checks._logprob_work`).

Costs reported: ``prompt_tokens`` (an upper bound of the upstream's ``usage.prompt_tokens``;
``prompt_tokens_exact`` is 1 when it came from counting rather than from bytes), ``media_tokens``
(the media estimates within it), ``output_tokens`` (the cap per sequence), ``sequences``,
``output_tokens_reserved`` ((cap + llama-cpp-python's known overshoot,
:data:`OUTPUT_OVERSHOOT`) x sequences) and ``tokens_reserved`` (prompt + reserved output:
what a token rate limiter charges before forwarding), and ``logprob_work`` when step 4 counted
some.

Codes: ``max_tokens_exceeded``, ``prompt_tokens_exceeded``, ``context_length_exceeded``,
``output_cap_bypass``, ``logprob_work_exceeded``, ``json_depth_exceeded`` (tool-call arguments
nested too deep to parse), and the sandbox's ``chat_template_*`` limits and ``deadline_exceeded`` from a render.
"""

from __future__ import annotations

from typing import Any, Protocol

from guard.checks._cap_bypass import check_llama_cpp_cap_bypass
from guard.checks._logprob_work import check_llama_cpp_logprob_work, echoes_prompt
from guard.checks._output import clamped_to_window, output_cap, window_remainder
from guard.checks._policy import PolicyView
from guard.checks._result import CheckResult, Mutation, pure_check
from guard.checks._tokens_limits import TokensLimits
from guard.checks.templates import TemplatesLimits
from guard.json import JsonLimits
from guard.prompt import (
    Counting,
    Flavour,
    PromptCounting,
    PromptLimits,
    count_prompt,
)
from guard.request import RequestView
from guard.tokens import get_counter

__all__ = ["OUTPUT_OVERSHOOT", "TokensReads", "check_tokens", "prompt_counting", "render_flavours"]

# Output tokens an upstream may generate past the cap, per sequence. llama-cpp-python 0.3.36
# (Llama._create_completion) skips its max_tokens test while the text ends inside a UTF-8
# character (`multibyte_fix`): up to 3 more tokens for a 4-byte character cut by the cap (a
# grammar of 4-byte characters: completion_tokens 8 for max_tokens 5). vLLM stops at the cap.
# Reserved in front of llama-cpp-python; the reconcile charges what `usage` says.
OUTPUT_OVERSHOOT = 3


class TokensReads(Protocol):
    """The limit sets the tokens check reads."""

    @property
    def tokens(self) -> TokensLimits: ...

    @property
    def templates(self) -> TemplatesLimits: ...

    @property
    def json_(self) -> JsonLimits: ...


@pure_check
def check_tokens(view: RequestView, policy: PolicyView[TokensReads]) -> CheckResult | None:
    body = view.obj
    if body is None:
        return None
    tokens = policy.limits.tokens
    kind = policy.upstream_kind
    mutations: list[Mutation] = []
    output = output_cap(body, view.endpoint, tokens, kind, mutations)
    how = prompt_counting(policy)
    if kind != "vllm" and output is not None:
        # llama-cpp-python's (or an upstream not known yet: it may be one).
        check_llama_cpp_cap_bypass(body, how.counter)
    limits = PromptLimits(
        tokens.max_prompt_tokens,
        tokens.context_length,
        0 if output is None else output.tokens,
        output is not None and not output.implicit,
    )
    # Log-probabilities that echo the prompt need its exact count: asked for with it.
    echo = kind == "llama_cpp" and output is not None and echoes_prompt(body, view.endpoint)
    prompt = count_prompt(view, how, limits, exact_per_unit=echo)
    if output is not None and output.to_window:
        assert tokens.context_length is not None  # to_window is only set with a window
        output = clamped_to_window(output, prompt.per_unit, tokens.context_length, mutations)
    sequences = 0
    reserved = 0
    if output is not None:
        prompts = len(prompt.per_unit) if view.endpoint in ("completions", "other") else 1
        sequences = output.per_prompt * max(1, prompts)
        if output.implicit:
            reserved = window_remainder(
                prompt.per_unit, prompts, output.per_prompt, tokens.context_length
            )
        else:
            overshoot = OUTPUT_OVERSHOOT if kind == "llama_cpp" else 0
            reserved = (output.tokens + overshoot) * sequences
    logprob_work = 0
    if kind == "llama_cpp" and output is not None:
        logprob_work = check_llama_cpp_logprob_work(
            body,
            view.endpoint,
            per_unit=prompt.per_unit if prompt.exact_per_unit is None else prompt.exact_per_unit,
            output=None if output.implicit else output.tokens,
            window=tokens.context_length,
            vocabulary=how.counter.vocabulary_size,
            limit=tokens.max_logprob_work,
        )
    costs = {
        "prompt_tokens": prompt.tokens,
        "prompt_tokens_exact": int(prompt.exact),
        "output_tokens": 0 if output is None or output.implicit else output.tokens,
        "sequences": sequences,
        "output_tokens_reserved": reserved,
        "tokens_reserved": prompt.tokens + reserved,
    }
    if output is not None and output.implicit:
        costs["output_tokens_implicit"] = 1
    if prompt.media:
        costs["media_tokens"] = prompt.media
    if logprob_work:
        costs["logprob_work"] = logprob_work
    return CheckResult.passed(costs, tuple(mutations))


def render_flavours(policy: PolicyView[TokensReads]) -> tuple[Flavour, ...]:
    """The upstreams whose renders are modelled: ``render_like`` when the policy sets it, else
    the upstream kind in force alone (both while it is not known)."""
    tokens = policy.limits.tokens
    kind = policy.upstream_kind
    if "render_like" in tokens.model_fields_set or kind == "other":
        return tokens.render_like
    return (kind,)


# The counting settings of the policies seen lately, by the identity of what they are built
# from (a policy's sections are immutable; the objects are kept, so an id is not reused).
_COUNTING: dict[tuple[int, int, int, str], tuple[Any, PromptCounting]] = {}


def prompt_counting(policy: PolicyView[TokensReads]) -> PromptCounting:
    """How the policy counts prompts (built once per policy)."""
    limits = policy.limits
    tokens, templates, json_ = limits.tokens, limits.templates, limits.json_
    kind = policy.upstream_kind
    key = (id(tokens), id(templates), id(json_), kind)
    cached = _COUNTING.get(key)
    if cached is not None:
        return cached[1]
    counter = get_counter(tokens.tokenizer)
    flavours = render_flavours(policy)
    how = PromptCounting(
        counter=counter,
        units=Counting(
            per_message=tokens.per_message_tokens,
            per_request=tokens.per_request_tokens,
            tools=tokens.tools_tokens,
            image=tokens.tokens_per_image,
            video_frame=tokens.tokens_per_video_frame,
            audio=tokens.tokens_per_audio,
            media_as_text="llama_cpp" in flavours,
            special_tokens=counter.special_tokens,
            max_json_depth=json_.max_depth,
        ),
        flavours=flavours,
        chat_template=tokens.chat_template,
        tokenizer=tokens.tokenizer,
        request_templates=templates.allow_request_chat_template,
        exact=tokens.exact_costs,
        content_format=tokens.content_format,
        sandbox=templates.chat_template,
        template_depth=templates.max_depth,
        # Without a limit a template's expansion is weighed up to what the templates check allows.
        expansion_cap=templates.max_expansion_chars * 4 + 1,
    )
    if len(_COUNTING) >= 64:
        _COUNTING.clear()
    _COUNTING[key] = ((tokens, templates, json_), how)
    return how
