"""Exact prompt counts: the conversation rebuilt as the upstream builds it, rendered with the
upstream's own chat template in the hardened sandbox, and tokenized.

The template and its special tokens come from :mod:`guard.prompt._template_source` (or from the
request, when the policy accepts request templates: the upstream then renders that one). Each
upstream listed in ``limits.tokens.render_like`` builds the conversation its own way
(:mod:`guard.prompt._vllm_chat`: ``vllm`` as vLLM 0.32 does, ``llama_cpp`` as llama-cpp-python
0.3.36's ``Jinja2ChatFormatter`` does), and the renders are independent: every render that
succeeds is a candidate and the largest count wins. ``continue_final_message`` cuts vLLM's
prompt after the final message, as transformers cuts it.

Each distinct rendered prompt is counted once, with an early stop past the limit, by the policy's tokenizer, special-token text parsed as the special tokens, as both servers do (the
sandbox bounds the render itself: output, values, loops, time). Media placeholders are not
rendered: the media tokens are the per-item estimates.

A render that fails says why (:class:`RenderOutcome`): the upstream's own refusal (the
template's ``raise_exception(...)``, or what vLLM refuses before rendering, such as both
``add_generation_prompt`` and ``continue_final_message``: the upstream answers 400 with that
message too), or a failure of the guard's (the sandbox refusing an operation, the deadline on a
loaded machine). Only when no render succeeds does the caller refuse with the upstream's reason,
or, without one, fall back to the bound.
The other budget limits (tokens, output, values, loops) are refusals: the upstream would pay
them too.
"""

from __future__ import annotations

from dataclasses import dataclass

from guard.budget import Budget, Limits
from guard.errors import GuardError, LimitExceeded, TemplateError
from guard.jinja import (
    CODE_RAISED,
    CODE_RENDER_FAILED,
    ChatTemplateLimits,
    GuardedTemplate,
    compile_chat_template,
)
from guard.jinja import render_chat_template as _render
from guard.prompt._terms import Flavour
from guard.prompt._units import ChatInput
from guard.prompt._vllm_chat import cut_at_marker, llama_cpp_call, vllm_call
from guard.tokens import TokenCounter

__all__ = ["RenderOutcome", "render_count"]


@dataclass(frozen=True)
class RenderOutcome:
    """The largest count among the renders that succeeded (``tokens``), or, when none did,
    ``None`` and the upstream's own refusal if there is one (``raised``: the template's
    ``raise_exception``, or what vLLM refuses before rendering)."""

    tokens: int | None
    raised: GuardError | None = None


def render_count(
    chat: ChatInput,
    text: str,
    special_tokens: tuple[tuple[str, str], ...],
    flavours: tuple[Flavour, ...],
    counter: TokenCounter,
    limit: int,
    sandbox: ChatTemplateLimits,
    max_depth: int,
    content_format: str = "auto",
    param: str | None = None,
) -> RenderOutcome:
    """The conversation rendered with the template ``text`` as each upstream in ``flavours``
    renders it (module docstring); raises ``prompt_tokens_exceeded`` (or a sandbox limit) once a
    render is past ``limit``."""
    compiled: GuardedTemplate = compile_chat_template(text, sandbox)
    counted: dict[str, int] = {}
    raised: GuardError | None = None
    for flavour in flavours:
        if flavour == "vllm":
            call = vllm_call(chat, text, special_tokens, max_depth, content_format)
        else:
            call = llama_cpp_call(chat, special_tokens)
        if call.refused is not None:
            # The upstream answers 400 before rendering (vLLM's own checks): not a cost.
            if raised is None:
                raised = TemplateError(CODE_RENDER_FAILED, call.refused)
            continue
        # Output, loops, values and time are the sandbox's to bound.
        budget = Budget(Limits(deadline_s=sandbox.deadline_s))
        try:
            rendered = _render(compiled, call.variables, limits=sandbox, budget=budget)
        except TemplateError as exc:  # the sandbox or the template refused this input
            if exc.code == CODE_RAISED and raised is None:
                raised = exc
            continue
        except LimitExceeded as exc:
            if exc.code == "deadline_exceeded":
                continue  # the guard is slow (a loaded machine): the bound decides
            raise
        prompt = cut_at_marker(rendered) if call.continue_final else rendered
        if prompt is None:
            continue  # transformers refuses: the template dropped the final message
        if prompt in counted:  # the flavours usually render the same prompt
            continue
        stats = counter.measure(prompt, limit, exact=True)
        if not stats.within_limit:
            raise LimitExceeded(
                "prompt_tokens_exceeded",
                f"the rendered prompt has more tokens than the limit of {limit}",
                param=param,
            )
        counted[prompt] = stats.tokens
    if counted:
        return RenderOutcome(max(counted.values()))
    return RenderOutcome(None, raised)
