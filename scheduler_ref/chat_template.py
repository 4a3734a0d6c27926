"""Chat templates of the reference scheduler: messages (+ tools) -> prompt text, per profile.

- ``vulnerable``: what many servers do. A plain ``ImmutableSandboxedEnvironment`` configured as
  Hugging Face configures it, request templates accepted (top level or smuggled in
  ``chat_template_kwargs``) and every ``chat_template_kwargs`` key passed through to the template,
  as vLLM did. Nested loops, ``'A' * 10**10`` or ``10**(10**7)`` (which costs CPU merely to
  compile) run until memory or time runs out.
- ``hardened``: request templates refused unless the profile allows them, ``chat_template_kwargs``
  limited to :data:`~guard.jinja._chat_template.SAFE_TEMPLATE_KWARGS`, and the template rendered by
  :mod:`guard.jinja._chat_template`'s hardened sandbox with the prompt token budget charged as the
  output is generated.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from jinja2 import Template
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from guard.budget import Budget, Limits
from guard.errors import GuardError
from guard.jinja import (
    DEFAULT_LIMITS,
    SAFE_TEMPLATE_KWARGS,
    ChatTemplateLimits,
    check_request_template_fields,
    hf_strftime_now,
    hf_tojson,
    map_template_exception,
    raise_exception,
    render_chat_template,
)
from guard.tokens import get_counter
from scheduler_ref.profiles import Profile

# The reference model's special tokens (ChatML, as Qwen2.5 uses them).
SPECIAL_TOKENS: dict[str, str] = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}

# Qwen2.5's ChatML template with tool calling (Apache-2.0), with ``developer`` read as ``system``.
DEFAULT_CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] in ('system', 'developer') %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] in ('system', 'developer') %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role in ("system", "developer") and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    profile: Profile,
    *,
    chat_template: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    budget: Budget | None = None,
) -> str:
    """Render ``messages`` (and ``tools``) to prompt text with the profile's chat template rules.

    Raises :class:`~guard.errors.GuardError` (``chat_template_not_allowed``,
    ``chat_template_kwarg_not_allowed``, the sandbox's codes, ``prompt_tokens_exceeded``).
    """
    kwargs = dict(chat_template_kwargs or {})
    check_request_template_fields(
        chat_template=chat_template,
        chat_template_kwargs=kwargs,
        allow_request_template=profile.allow_request_chat_template,
        allowed_kwargs=SAFE_TEMPLATE_KWARGS if profile.hardened_chat_template else None,
    )
    # vLLM let chat_template_kwargs["chat_template"] override the template; so does vulnerable.
    source = kwargs.pop("chat_template", None) or chat_template or DEFAULT_CHAT_TEMPLATE
    variables: dict[str, Any] = {
        **SPECIAL_TOKENS,
        "messages": [dict(m) for m in messages],
        "tools": [dict(t) for t in tools] if tools else None,
        "add_generation_prompt": add_generation_prompt,
        # Later keys win: chat_template_kwargs may override anything (vulnerable) or the
        # allow-listed switches (hardened).
        **kwargs,
    }
    if profile.hardened_chat_template:
        return render_chat_template(
            source,
            variables,
            limits=limits_for(profile),
            budget=budget if budget is not None else _default_budget(profile),
        )
    return _render_vulnerable(source, variables, budget)


def limits_for(profile: Profile) -> ChatTemplateLimits:
    """The sandbox limits of a hardened profile (its render deadline)."""
    if profile.render_deadline_s is None:
        return DEFAULT_LIMITS
    return _with_deadline(profile.render_deadline_s)


@functools.lru_cache(maxsize=8)
def _with_deadline(deadline_s: float) -> ChatTemplateLimits:
    # Built once per deadline: a limit set is validated when built (~20 us), not per request.
    return replace(DEFAULT_LIMITS, deadline_s=deadline_s)


def _default_budget(profile: Profile) -> Budget:
    """The prompt's token budget (cl100k_base, counted as the template renders) and deadline."""
    limit = profile.max_prompt_tokens
    limits = Limits(max_tokens=limit, deadline_s=profile.render_deadline_s)
    if limit is None:
        return Budget(limits)
    return Budget(limits, tokens=get_counter("cl100k_base").incremental(limit, param="messages"))


# -- vulnerable -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def vulnerable_environment() -> ImmutableSandboxedEnvironment:
    """The environment Hugging Face ``transformers`` builds for chat templates."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = hf_tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = hf_strftime_now
    return env


@functools.lru_cache(maxsize=64)
def compile_vulnerable(source: str) -> Template:
    """Compile in the vulnerable environment (constant folding included: this is where
    ``{{ 10**(10**7) }}`` burns CPU before anything renders)."""
    return vulnerable_environment().from_string(source)


def _render_vulnerable(source: str, variables: dict[str, Any], budget: Budget | None) -> str:
    try:
        text = compile_vulnerable(source).render(variables)
    except (GuardError, MemoryError):
        raise  # a naive server does not survive running out of memory
    except Exception as exc:
        raise map_template_exception(exc) from None
    if budget is not None:
        # Counted after the whole prompt exists, as a naive server does.
        budget.charge_text(text)
    return text
