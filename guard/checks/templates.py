"""The templates check: prompt templates bounded, request chat templates refused or sandboxed.

- ``prompt_template`` and every ``template_vars`` value: balanced ``{{``/``}}`` and nesting
  within ``limits.templates.max_depth`` (one linear scan each, :mod:`guard.template_scan`);
  then, through the variables, the depth and a bound on the expansion (characters and
  placeholders expanded) computed without expanding (:mod:`guard.checks._placeholders`).
- ``chat_template`` at the top level or inside ``chat_template_kwargs``, on any endpoint:
  refused unless ``allow_request_chat_template``; then scanned, compiled in the hardened
  sandbox and (``render_request_chat_template``) rendered with the request's messages under the
  sandbox's limits and the prompt-token cap. ``chat_template_kwargs`` keys must be on the
  allowlist (``tokenize`` never is).

Codes: ``template_depth_exceeded``, ``template_unbalanced``, ``template_expansion_exceeded``,
``invalid_type``, the ``chat_template_*`` codes of :mod:`guard.jinja._chat_template`,
``deadline_exceeded`` (408) and ``prompt_tokens_exceeded`` from a render.
"""

from __future__ import annotations

import functools
from typing import Any

from guard.budget import Budget, Limits
from guard.checks._jsonsize import indent4_size
from guard.checks._placeholders import Source, bound_expansion, parse_source
from guard.checks._result import CheckResult, pure_check
from guard.checks._template_source import load_chat_template
from guard.errors import GuardError, LimitExceeded, TemplateError
from guard.jinja import (
    CODE_INVALID,
    CODE_KWARG_NOT_ALLOWED,
    RESERVED_TEMPLATE_KWARGS,
    check_request_template_fields,
    compile_chat_template,
    render_chat_template,
    template_variables,
)
from guard.policy._models import Policy, TemplatesPolicy
from guard.request_view import RequestView
from guard.template_scan import check_template
from guard.tokens import get_counter

__all__ = ["check_templates"]

TEMPLATE_EXPANSION_EXCEEDED = "template_expansion_exceeded"


def _shown(name: str) -> str:
    return name if len(name) <= 64 else name[:64] + "..."


@pure_check
def check_templates(view: RequestView, policy: Policy) -> CheckResult | None:
    body = view.obj
    if body is None:
        return None
    costs: dict[str, int] = {}
    _check_prompt_template(body, policy.limits.templates, costs)
    _check_chat_template(body, policy, costs)
    return CheckResult.passed(costs)


def _check_prompt_template(
    body: dict[str, Any], limits: TemplatesPolicy, costs: dict[str, int]
) -> None:
    template = body.get("prompt_template")
    variables = body.get("template_vars")
    if template is None and variables is None:
        return
    if template is not None and not isinstance(template, str):
        raise GuardError(
            "invalid_type", "prompt_template must be a string", param="prompt_template"
        )
    if variables is not None and not isinstance(variables, dict):
        raise GuardError("invalid_type", "template_vars must be an object", param="template_vars")
    depth = limits.max_depth
    sources: dict[str, Source] = {}
    for name, value in (variables or {}).items():
        param = f"template_vars.{_shown(name)}"
        if not isinstance(value, str):
            raise GuardError("invalid_type", f"{param} must be a string", param=param)
        check_template(value, max_depth=depth, param=param)
        if template is not None:
            sources[name] = parse_source(value)
    if template is None:
        return
    check_template(template, max_depth=depth, param="prompt_template")
    cap = max(limits.max_expansion_chars, limits.max_expansions) + 1
    bound = bound_expansion(parse_source(template), sources, depth, cap)
    if bound.too_deep is not None:
        param = f"template_vars.{_shown(bound.too_deep)}" if bound.too_deep else "prompt_template"
        raise LimitExceeded(
            "template_depth_exceeded",
            f"prompt_template nests deeper than {depth} through its variables "
            "(placeholders in template_vars values count from where they are expanded; "
            "a variable that refers to itself never ends)",
            param=param,
        )
    if bound.size > limits.max_expansion_chars:
        raise LimitExceeded(
            TEMPLATE_EXPANSION_EXCEEDED,
            f"prompt_template may expand to more than {limits.max_expansion_chars} characters "
            "with these template_vars",
            param="template_vars",
        )
    if bound.expansions > limits.max_expansions:
        raise LimitExceeded(
            TEMPLATE_EXPANSION_EXCEEDED,
            f"prompt_template may expand more than {limits.max_expansions} placeholders "
            "with these template_vars",
            param="template_vars",
        )
    costs["template_expansion_chars"] = bound.size
    costs["template_expansions"] = bound.expansions


def _check_chat_template(body: dict[str, Any], policy: Policy, costs: dict[str, int]) -> None:
    limits = policy.limits.templates
    template = body.get("chat_template")
    kwargs = body.get("chat_template_kwargs")
    if template is None and kwargs is None:
        return
    if kwargs is not None and not isinstance(kwargs, dict):
        raise GuardError(
            "invalid_type", "chat_template_kwargs must be an object", param="chat_template_kwargs"
        )
    check_request_template_fields(
        chat_template=template,
        chat_template_kwargs=kwargs,
        allow_request_template=limits.allow_request_chat_template,
        allowed_kwargs=None,
    )
    if kwargs:
        _check_kwargs(kwargs, policy)
    if not limits.allow_request_chat_template:
        return
    for source, param in (
        (template, "chat_template"),
        ((kwargs or {}).get("chat_template"), "chat_template_kwargs.chat_template"),
    ):
        if source is None:
            continue
        try:
            _validate_chat_template(source, body, kwargs or {}, policy, costs)
        except GuardError as exc:
            if exc.param in (None, "chat_template"):
                exc.param = param
            raise


# chat_template_kwargs that carry content rather than switches (the prompt count bounds them).
_CONTENT_KWARGS = frozenset({"documents"})


def _check_kwargs(kwargs: dict[str, Any], policy: Policy) -> None:
    """Each key accepted (the allowlist, or a variable the upstream's template reads; never a
    reserved name) and the values' size within the cap."""
    limits = policy.limits.templates
    accepted: frozenset[str] | None = None
    left = limits.max_chat_template_kwargs_bytes
    for key, value in kwargs.items():
        param = f"chat_template_kwargs.{_shown(key)}"
        if key == "chat_template" and limits.allow_request_chat_template:
            continue
        reason = RESERVED_TEMPLATE_KWARGS.get(key)
        if reason is not None:
            raise TemplateError(
                CODE_KWARG_NOT_ALLOWED,
                f"chat_template_kwargs key {_shown(key)!r} is never accepted: {reason}",
                param=param,
            )
        if key not in limits.chat_template_kwargs_allowlist:
            if accepted is None:
                accepted = _template_reads(policy)
            if key not in accepted:
                raise TemplateError(
                    CODE_KWARG_NOT_ALLOWED,
                    f"chat_template_kwargs key {_shown(key)!r} is not read by the upstream's "
                    "chat template and not on limits.templates.chat_template_kwargs_allowlist",
                    param=param,
                )
        if key in _CONTENT_KWARGS:
            continue  # content the template prints: counted in the prompt's tokens
        left -= indent4_size(value, left + 1)
        if left < 0:
            raise TemplateError(
                CODE_KWARG_NOT_ALLOWED,
                f"chat_template_kwargs values are larger than "
                f"{limits.max_chat_template_kwargs_bytes} bytes together",
                param=param,
            )


def _template_reads(policy: Policy) -> frozenset[str]:
    """The variables the upstream's chat template reads (none when it is not known, or when
    the policy does not take kwargs from it)."""
    limits = policy.limits.templates
    if not limits.chat_template_kwargs_from_template:
        return frozenset()
    tokens = policy.limits.tokens
    return _variables_of(tokens.chat_template, tokens.tokenizer, limits.chat_template)


@functools.lru_cache(maxsize=16)
def _variables_of(spec: str | None, tokenizer: str, sandbox: Any) -> frozenset[str]:
    try:
        source = load_chat_template(spec, tokenizer)
    except (OSError, ValueError):
        return frozenset()  # refused at start-up; a file gone since counts as none
    if source is None:
        return frozenset()
    names: set[str] = set()
    for text in (source.default, source.tool_use):
        if text is not None:
            names |= template_variables(text, sandbox)
    return frozenset(names)


def _validate_chat_template(
    source: Any,
    body: dict[str, Any],
    kwargs: dict[str, Any],
    policy: Policy,
    costs: dict[str, int],
) -> None:
    if not isinstance(source, str):
        raise TemplateError(CODE_INVALID, "the chat template must be a string")
    sandbox = policy.limits.templates.chat_template
    compiled = compile_chat_template(source, sandbox)
    if not policy.limits.templates.render_request_chat_template:
        return
    cap = policy.limits.tokens.prompt_limit
    counter = get_counter(policy.limits.tokens.tokenizer)
    budget = Budget(
        Limits(max_tokens=cap, deadline_s=sandbox.deadline_s),
        tokens=counter.incremental(cap, param="messages"),
    )
    messages = body.get("messages")
    variables: dict[str, Any] = {
        "messages": messages if isinstance(messages, list) else [],
        "tools": body.get("tools"),
        "documents": body.get("documents"),
        "add_generation_prompt": body.get("add_generation_prompt", True),
        "bos_token": "",
        "eos_token": "",
    }
    variables.update((k, v) for k, v in kwargs.items() if k != "chat_template")
    try:
        render_chat_template(compiled, variables, limits=sandbox, budget=budget)
    except LimitExceeded as exc:
        tokens = policy.limits.tokens
        if exc.code != "prompt_tokens_exceeded" or tokens.max_prompt_tokens is not None:
            raise
        raise LimitExceeded(
            "context_length_exceeded",
            f"the rendered prompt has more tokens than the context length of "
            f"{tokens.context_length}",
            param=exc.param,
        ) from None
    costs["chat_template_prompt_tokens"] = budget.tokens_used()
