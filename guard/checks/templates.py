"""The templates check: prompt templates bounded, request chat templates refused or sandboxed.

- ``prompt_template`` and every ``template_vars`` value: balanced ``{{``/``}}`` and nesting
  within ``limits.templates.max_depth`` (one linear scan each, :mod:`guard.template_scan`);
  then, through the variables, the depth and a bound on the expansion (characters and
  placeholders expanded) computed without expanding (:func:`guard.prompt.bound_expansion`).
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
from typing import Any, Protocol

from pydantic import Field, field_validator
from pydantic.dataclasses import dataclass

from guard._limits import LIMITS_CONFIG, LimitsModel, PosFloat, PosInt
from guard.budget import Budget, Limits
from guard.checks._policy import PolicyView
from guard.checks._result import CheckResult, pure_check
from guard.checks._tokens_limits import TokensLimits
from guard.errors import GuardError, LimitExceeded, TemplateError
from guard.jinja import (
    CODE_INVALID,
    CODE_KWARG_NOT_ALLOWED,
    COMMON_TEMPLATE_KWARGS,
    RESERVED_TEMPLATE_KWARGS,
    ChatTemplateLimits,
    check_request_template_fields,
    compile_chat_template,
    render_chat_template,
    template_variables,
)
from guard.prompt import Source, bound_expansion, indent4_size, load_chat_template, parse_source
from guard.request import RequestView
from guard.template_scan import check_template
from guard.tokens import get_counter

__all__ = ["RequestTemplateLimits", "TemplatesLimits", "TemplatesReads", "check_templates"]


@dataclass(frozen=True, config=LIMITS_CONFIG)
class RequestTemplateLimits(ChatTemplateLimits):
    """The sandbox's limits for request chat templates: the library's, with the hardened
    scheduler's render deadline instead of its 1 s."""

    deadline_s: PosFloat | None = Field(
        default=0.25,
        description="Seconds one validation render may take (the hardened scheduler's render "
        "deadline; the library default is 1 s). `null`: none.",
    )


class TemplatesLimits(LimitsModel):
    max_depth: int = Field(
        default=8,
        strict=True,
        ge=1,
        le=64,
        description="Deepest `{{ }}` placeholder nesting in `prompt_template` and "
        "`template_vars` values, through variables too (the seed's patch: 8).",
    )
    max_expansion_chars: PosInt = Field(
        default=65_536,
        description="Most characters `prompt_template` may expand to with `template_vars`, "
        "bounded before any expansion (billion-laughs variables stop here). 64 KiB is about 8 "
        "times a 2048-token prompt.",
    )
    max_expansions: PosInt = Field(
        default=16_384,
        description="Most placeholder expansions in one `prompt_template` (the hardened "
        "scheduler's step budget).",
    )
    allow_request_chat_template: bool = Field(
        default=False,
        description="Accept `chat_template` (top level or in `chat_template_kwargs`) from "
        "requests. Refused by default, as vLLM does without `--trust-request-chat-template`; "
        "when allowed, each is scanned, compiled and rendered in the hardened sandbox.",
    )
    render_request_chat_template: bool = Field(
        default=True,
        description="When request templates are allowed: render each with the request's "
        "messages under `chat_template` limits and `limits.tokens.max_prompt_tokens` before "
        "forwarding (else only scan and compile it).",
    )
    chat_template_kwargs_allowlist: tuple[str, ...] = Field(
        default=tuple(sorted(COMMON_TEMPLATE_KWARGS)),
        description="`chat_template_kwargs` keys accepted whatever the template: the switches "
        "the chat templates of common open-weight models read (Qwen 3, GLM 4.5, Gemma 4 and "
        "SmolLM 3's `enable_thinking`; DeepSeek V3.1 and Granite's `thinking`; gpt-oss's "
        "`reasoning_effort`, `model_identity`, `builtin_tools`; Llama 3.1's "
        "`tools_in_user_message`, `date_string`, `builtin_tools`, `custom_tools`; Command R's "
        "`citation_mode`, `safety_mode`; Granite 3.3's `controls`; Qwen2-VL's "
        "`add_vision_id`; SmolLM 3's `xml_tools`, `python_tools`), `documents` (Command R's "
        "and Granite's RAG documents, as granite-io and vLLM's examples send them), and "
        "`add_generation_prompt`, `continue_final_message`. The reserved names (below) may not "
        "be listed.",
    )
    chat_template_kwargs_from_template: bool = Field(
        default=True,
        description="Also accept every variable the upstream's chat template reads "
        "(`limits.tokens.chat_template`, configured or found next to the tokenizer), taken "
        "from its syntax tree as vLLM takes them (`jinja2.meta.find_undeclared_variables`). "
        "Never accepted, whatever the template reads, are the names that change what the "
        "server does rather than what the template prints: `chat_template` (see "
        "`allow_request_chat_template`), `tokenize` (vLLM GHSA-69j4-grxj-j64p), "
        "`conversation`, `messages`, `tools` (use the top-level fields), the "
        "tokenizer arguments of `apply_chat_template` (`padding`, `truncation`, `max_length`, "
        "`return_tensors`, `return_dict`, `return_assistant_tokens_mask`, "
        "`tokenizer_kwargs`, `processor_kwargs`, `mm_processor_kwargs`), the special tokens "
        "(`bos_token`, `eos_token`, ...) and the functions and Jinja globals templates call "
        "(`raise_exception`, `strftime_now`, `range`, `namespace`, ...).",
    )
    max_chat_template_kwargs_bytes: PosInt = Field(
        default=16_384,
        description="Most bytes of all `chat_template_kwargs` values together, weighed as "
        "indent-4 JSON as the prompt count weighs them (`chat_template_kwarg_not_allowed` "
        "beyond): strings, numbers, and the lists and objects some templates read "
        "(`builtin_tools`, `controls`). `documents` is content, not a switch: it is not held "
        "to this cap but counted in the prompt's tokens, as every value here is.",
    )
    chat_template: RequestTemplateLimits = Field(
        default_factory=lambda: RequestTemplateLimits(),
        description="Limits of the hardened sandbox for request chat templates.",
    )

    @field_validator("chat_template_kwargs_allowlist")
    @classmethod
    def _no_dangerous_kwargs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            reason = RESERVED_TEMPLATE_KWARGS.get(name)
            if reason is not None:
                raise ValueError(f"{name[:64]!r} may not be allowlisted: {reason}")
        return value


TEMPLATE_EXPANSION_EXCEEDED = "template_expansion_exceeded"


def _shown(name: str) -> str:
    return name if len(name) <= 64 else name[:64] + "..."


class TemplatesReads(Protocol):
    """The limit sets the templates check reads."""

    @property
    def templates(self) -> TemplatesLimits: ...

    @property
    def tokens(self) -> TokensLimits: ...


@pure_check
def check_templates(view: RequestView, policy: PolicyView[TemplatesReads]) -> CheckResult | None:
    body = view.obj
    if body is None:
        return None
    costs: dict[str, int] = {}
    _check_prompt_template(body, policy.limits.templates, costs)
    _check_chat_template(body, policy, costs)
    return CheckResult.passed(costs)


def _check_prompt_template(
    body: dict[str, Any], limits: TemplatesLimits, costs: dict[str, int]
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


def _check_chat_template(
    body: dict[str, Any], policy: PolicyView[TemplatesReads], costs: dict[str, int]
) -> None:
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


def _check_kwargs(kwargs: dict[str, Any], policy: PolicyView[TemplatesReads]) -> None:
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


def _template_reads(policy: PolicyView[TemplatesReads]) -> frozenset[str]:
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
    policy: PolicyView[TemplatesReads],
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
