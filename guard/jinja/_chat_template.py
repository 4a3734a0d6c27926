"""Hugging Face-style Jinja chat templates, rendered in a hardened sandbox.

A chat template is a program: a request that may send one (``chat_template``, or the same smuggled
in ``chat_template_kwargs``) can make the server loop, allocate or compute without bound. Jinja's
``ImmutableSandboxedEnvironment`` stops attribute escapes, not resource use (THREATS.md). Here:

1. :func:`check_chat_template` measures the source in one linear pass before Jinja sees it
   (size, block nesting, bracket nesting, syntax tokens);
2. :func:`compile_chat_template` compiles it once per source (bounded LRU cache) in
   :class:`HardenedEnvironment`, which folds nothing at compile time;
3. :func:`render_chat_template` renders with ``generate()``, charging loops, calls, values made,
   output (to a :class:`~guard.budget.Budget`'s token counter too) and time as it goes.

Every failure is a :class:`~guard.errors.GuardError` with a stable code; nothing else escapes.
:func:`check_request_template_fields` is the request-level policy (templates in requests, and
which ``chat_template_kwargs`` keys are accepted).
"""

from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from typing import Any

from jinja2 import meta
from jinja2.exceptions import SecurityError, TemplateSyntaxError
from jinja2.exceptions import TemplateError as JinjaTemplateError

from guard.budget import Budget
from guard.errors import GuardError, LimitExceeded, ScanLimitError, TemplateError
from guard.jinja._filters import TemplateRaised, hf_strftime_now, hf_tojson, raise_exception
from guard.jinja._meters import (
    CODE_DEADLINE,
    CODE_EXPANSION,
    CODE_INVALID,
    CODE_KWARG_NOT_ALLOWED,
    CODE_LOOP_BUDGET,
    CODE_NESTING,
    CODE_NOT_ALLOWED,
    CODE_RAISED,
    CODE_RENDER_FAILED,
    CODE_SECURITY,
    CODE_TOO_LARGE,
    CODE_VALUE_TOO_LARGE,
    DEFAULT_LIMITS,
    ChatTemplateLimits,
    RenderState,
    reset_state,
    set_state,
)
from guard.jinja._sandbox import GuardedTemplate, HardenedEnvironment
from guard.jinja._scan import ScanStats, scan_template

__all__ = [
    "CODE_DEADLINE",
    "CODE_EXPANSION",
    "CODE_INVALID",
    "CODE_KWARG_NOT_ALLOWED",
    "CODE_LOOP_BUDGET",
    "CODE_NESTING",
    "CODE_NOT_ALLOWED",
    "CODE_RAISED",
    "CODE_RENDER_FAILED",
    "CODE_SECURITY",
    "CODE_TOO_LARGE",
    "CODE_VALUE_TOO_LARGE",
    "COMMON_TEMPLATE_KWARGS",
    "DEFAULT_LIMITS",
    "RESERVED_TEMPLATE_KWARGS",
    "SAFE_TEMPLATE_KWARGS",
    "ChatTemplateLimits",
    "GuardedTemplate",
    "HardenedEnvironment",
    "ScanStats",
    "TemplateRaised",
    "check_chat_template",
    "check_request_template_fields",
    "compile_chat_template",
    "hf_strftime_now",
    "hf_tojson",
    "map_template_exception",
    "raise_exception",
    "render_chat_template",
    "template_variables",
]

# chat_template_kwargs keys a hardened server accepts: switches real templates read. Everything
# else (``tokenize``, ``chat_template``, variables that would shadow ``messages`` or the special
# tokens) is refused.
SAFE_TEMPLATE_KWARGS = frozenset(
    {
        "add_generation_prompt",
        "continue_final_message",
        "enable_thinking",
        "thinking",
        "reasoning_effort",
    }
)
# chat_template_kwargs names refused whatever the template reads, and why: each changes what
# the server does rather than what the template prints (vLLM 0.32 passes the request's kwargs
# to transformers' ``apply_chat_template`` beside its own arguments), or replaces a value the
# server computes and the guard counts.
RESERVED_TEMPLATE_KWARGS: Mapping[str, str] = {
    "chat_template": "replaces the server's template (see allow_request_chat_template)",
    "tokenize": "makes the server tokenize while rendering (vLLM GHSA-69j4-grxj-j64p)",
    "conversation": "replaces the conversation the server builds",
    "messages": "replaces the conversation the server builds",
    "tools": "replaces the request's tools; use the top-level field",
    "padding": "a tokenizer argument of apply_chat_template",
    "truncation": "a tokenizer argument of apply_chat_template (cuts the prompt)",
    "max_length": "a tokenizer argument of apply_chat_template",
    "return_tensors": "a tokenizer argument of apply_chat_template",
    "return_dict": "changes what apply_chat_template returns",
    "return_assistant_tokens_mask": "changes what apply_chat_template returns",
    "tokenizer_kwargs": "arguments for the server's tokenizer",
    "processor_kwargs": "arguments for the server's processor",
    "mm_processor_kwargs": "arguments for the server's media processor",
    "bos_token": "the tokenizer's special token",
    "eos_token": "the tokenizer's special token",
    "pad_token": "the tokenizer's special token",
    "unk_token": "the tokenizer's special token",
    "sep_token": "the tokenizer's special token",
    "cls_token": "the tokenizer's special token",
    "mask_token": "the tokenizer's special token",
    "additional_special_tokens": "the tokenizer's special tokens",
    "raise_exception": "a function the server defines for templates",
    "strftime_now": "a function the server defines for templates",
    "range": "a Jinja global",
    "dict": "a Jinja global",
    "namespace": "a Jinja global",
    "cycler": "a Jinja global",
    "joiner": "a Jinja global",
    "lipsum": "a Jinja global",
}

# The switches the chat templates of common open-weight models read, accepted when the
# upstream's own template is not known: Qwen 3 / GLM 4.5 / Gemma 4 / SmolLM 3
# (``enable_thinking``), DeepSeek V3.1 and Granite 3.2 (``thinking``), gpt-oss
# (``reasoning_effort``, ``model_identity``, ``builtin_tools``), Llama 3.1-3.3
# (``tools_in_user_message``, ``date_string``, ``builtin_tools``, ``custom_tools``), Command R
# and Command A (``citation_mode``, ``safety_mode``), Granite 3.3 (``controls``), Qwen2-VL
# (``add_vision_id``), SmolLM 3 (``xml_tools``, ``python_tools``); ``documents`` (Command R's and
# Granite's RAG, which granite-io and vLLM's own examples send here rather than at the top
# level); and the generation switches.
COMMON_TEMPLATE_KWARGS = frozenset(
    {
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "enable_thinking",
        "thinking",
        "reasoning_effort",
        "model_identity",
        "builtin_tools",
        "tools_in_user_message",
        "date_string",
        "custom_tools",
        "citation_mode",
        "safety_mode",
        "controls",
        "add_vision_id",
        "xml_tools",
        "python_tools",
    }
)
_MAX_KWARG_STRING = 256
_CACHE_SIZE = 64


# -- request policy ---------------------------------------------------------------------------


def check_request_template_fields(
    *,
    chat_template: str | None,
    chat_template_kwargs: Mapping[str, Any] | None,
    allow_request_template: bool,
    allowed_kwargs: Collection[str] | None,
) -> None:
    """Refuse a request-supplied template unless allowed, and ``chat_template_kwargs`` keys
    outside ``allowed_kwargs`` (``None`` accepts any key, as vLLM did)."""
    kwargs = chat_template_kwargs or {}
    if not allow_request_template:
        if chat_template is not None:
            raise TemplateError(
                CODE_NOT_ALLOWED,
                "this server does not accept chat templates in requests",
                param="chat_template",
            )
        if "chat_template" in kwargs:
            raise TemplateError(
                CODE_NOT_ALLOWED,
                "this server does not accept chat templates in requests",
                param="chat_template_kwargs.chat_template",
            )
    if allowed_kwargs is None:
        return
    for key, value in kwargs.items():
        param = f"chat_template_kwargs.{str(key)[:64]}"
        if key == "chat_template" and allow_request_template:
            continue
        if key not in allowed_kwargs:
            raise TemplateError(
                CODE_KWARG_NOT_ALLOWED,
                f"chat_template_kwargs key {str(key)[:64]!r} is not accepted; allowed: "
                f"{', '.join(sorted(allowed_kwargs))}",
                param=param,
            )
        if not (
            value is None
            or isinstance(value, (bool, int, float))
            or (isinstance(value, str) and len(value) <= _MAX_KWARG_STRING)
        ):
            raise TemplateError(
                CODE_KWARG_NOT_ALLOWED,
                f"chat_template_kwargs values must be scalars (strings up to "
                f"{_MAX_KWARG_STRING} characters)",
                param=param,
            )


@functools.lru_cache(maxsize=64)
def template_variables(source: str, limits: ChatTemplateLimits = DEFAULT_LIMITS) -> frozenset[str]:
    """The variables a chat template reads and does not set itself (``messages``,
    ``add_generation_prompt``, its switches such as ``enable_thinking``), from its syntax tree
    as vLLM finds them (``jinja2.meta.find_undeclared_variables``); scanned first, so a
    template too large or nested too deep raises as it would compile."""
    check_chat_template(source, limits)
    try:
        tree = _variables_env().parse(source)
    except TemplateSyntaxError as exc:
        raise TemplateError(CODE_INVALID, f"the chat template does not parse: {exc}") from None
    return frozenset(meta.find_undeclared_variables(tree))


@functools.cache
def _variables_env() -> HardenedEnvironment:
    return HardenedEnvironment()


# -- checking and compiling -------------------------------------------------------------------


def _scan_error(exc: ScanLimitError) -> LimitExceeded:
    if exc.kind == "size":
        return LimitExceeded(
            CODE_TOO_LARGE,
            f"the chat template is larger than {exc.limit} bytes",
            param="chat_template",
        )
    if exc.kind == "tokens":
        return LimitExceeded(
            CODE_TOO_LARGE,
            f"the chat template has more than {exc.limit} syntax tokens",
            param="chat_template",
        )
    what = "blocks" if exc.kind == "block" else "brackets"
    return LimitExceeded(
        CODE_NESTING,
        f"the chat template nests {what} deeper than {exc.limit}",
        param="chat_template",
    )


def _check_stats(stats: ScanStats, limits: ChatTemplateLimits) -> None:
    for kind, value, limit in (
        ("size", stats.source_bytes, limits.max_source_bytes),
        ("tokens", stats.syntax_tokens, limits.max_syntax_tokens),
        ("block", stats.block_nesting, limits.max_block_nesting),
        ("expr", stats.expr_nesting, limits.max_expr_nesting),
    ):
        if value > limit:
            raise _scan_error(ScanLimitError(kind, value, limit))


def check_chat_template(source: str, limits: ChatTemplateLimits = DEFAULT_LIMITS) -> ScanStats:
    """The linear pre-compile scan: raises ``chat_template_too_large`` or
    ``chat_template_nesting_exceeded`` at the first limit crossed."""
    if not isinstance(source, str):
        raise TemplateError(CODE_INVALID, "the chat template must be a string")
    try:
        return scan_template(source, limits)
    except ScanLimitError as exc:
        raise _scan_error(exc) from None


class _TemplateCache:
    """Compiled templates by source, least recently used dropped first."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[str, tuple[GuardedTemplate, ScanStats]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, source: str) -> tuple[GuardedTemplate, ScanStats] | None:
        with self._lock:
            entry = self._entries.get(source)
            if entry is not None:
                self._entries.move_to_end(source)
            return entry

    def put(self, source: str, entry: tuple[GuardedTemplate, ScanStats]) -> None:
        with self._lock:
            self._entries[source] = entry
            self._entries.move_to_end(source)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


_ENVIRONMENT = HardenedEnvironment()
_CACHE = _TemplateCache(_CACHE_SIZE)


def compile_chat_template(
    source: str, limits: ChatTemplateLimits = DEFAULT_LIMITS
) -> GuardedTemplate:
    """Scan, then compile once per source in the hardened environment."""
    if not isinstance(source, str):
        raise TemplateError(CODE_INVALID, "the chat template must be a string")
    if len(source) > limits.max_source_bytes:
        raise _scan_error(ScanLimitError("size", len(source), limits.max_source_bytes))
    cached = _CACHE.get(source)
    if cached is not None:
        _check_stats(cached[1], limits)
        return cached[0]
    stats = check_chat_template(source, limits)
    try:
        template = _ENVIRONMENT.from_string(source)
    except Exception as exc:
        raise _compile_error(exc) from None
    assert isinstance(template, GuardedTemplate)
    _CACHE.put(source, (template, stats))
    return template


def _compile_error(exc: BaseException) -> GuardError:
    if isinstance(exc, TemplateSyntaxError):
        where = f" (line {exc.lineno})" if exc.lineno else ""
        return TemplateError(
            CODE_INVALID,
            f"the chat template does not compile: {str(exc.message or exc)[:300]}{where}",
            param="chat_template",
        )
    if isinstance(exc, (RecursionError, SyntaxError)):
        # Python's own limits on the generated code: recursion, nested parentheses or blocks.
        return LimitExceeded(
            CODE_NESTING,
            "the chat template's expressions nest too deeply to compile",
            param="chat_template",
        )
    if isinstance(exc, MemoryError):
        return LimitExceeded(CODE_TOO_LARGE, "the chat template is too large to compile")
    return TemplateError(
        CODE_INVALID,
        f"the chat template does not compile: {type(exc).__name__}: {str(exc)[:300]}",
        param="chat_template",
    )


# -- rendering --------------------------------------------------------------------------------


def map_template_exception(exc: BaseException) -> GuardError:
    """The GuardError for any exception raised while rendering a chat template."""
    if isinstance(exc, GuardError):
        return exc
    if isinstance(exc, RecursionError):
        return LimitExceeded(CODE_NESTING, "the chat template recursed too deeply")
    if isinstance(exc, MemoryError):
        return LimitExceeded(CODE_EXPANSION, "the chat template ran out of memory")
    if isinstance(exc, SecurityError):
        return TemplateError(CODE_SECURITY, f"the chat template was refused: {str(exc)[:300]}")
    if isinstance(exc, TemplateRaised):
        return TemplateError(CODE_RAISED, str(exc)[:1000])
    if isinstance(exc, TemplateSyntaxError):
        return _compile_error(exc)
    if isinstance(exc, JinjaTemplateError):
        return TemplateError(CODE_RENDER_FAILED, f"the chat template failed: {str(exc)[:300]}")
    return TemplateError(
        CODE_RENDER_FAILED,
        f"the chat template failed: {type(exc).__name__}: {str(exc)[:300]}",
    )


def render_chat_template(
    template: str | GuardedTemplate,
    variables: Mapping[str, Any],
    *,
    limits: ChatTemplateLimits = DEFAULT_LIMITS,
    budget: Budget | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Render a chat template (source or compiled) with ``variables`` under ``limits``.

    Output is charged to ``budget`` (its token counter stops the render as soon as the prompt
    crosses its token limit) and to ``limits.max_output_chars``. Raises only GuardError.
    """
    try:
        compiled = (
            template
            if isinstance(template, GuardedTemplate)
            else compile_chat_template(template, limits)
        )
        state = RenderState(limits, budget, clock)
        token = set_state(state)
        try:
            return "".join(compiled.generate(dict(variables)))
        finally:
            reset_state(token)
    except Exception as exc:
        raise map_template_exception(exc) from None
