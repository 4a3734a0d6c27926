"""The fallback bound of one sequence: each field the template can print counted on its own, with
an early stop at the tokens left (:meth:`guard.tokens.TokenCounter.measure`), plus the tokens
that are not text.

A field is counted in each form the upstreams print it, the largest winning: a string as it is,
a structured value as indent-4 JSON (built only once its size allows it to fit,
:mod:`._jsonsize`), a tool call's arguments as sent (llama-cpp-python) and as vLLM prints them
again. Inside a template's text each field may merge a token across its edges (one more each).
A prompt template is its expansion bounded, in tokens (:func:`._placeholders.expansion_tokens`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from guard.errors import LimitExceeded
from guard.prompt._jsonsize import indent4_size, indent4_text
from guard.prompt._terms import PromptCounting
from guard.prompt._units import PromptUnit
from guard.request import Path

__all__ = ["fields_tokens"]

# Tokens added to each field counted inside a template's text (the fallback bound): a token
# merged across its edges.
_EDGE = 1


class _Json:
    """A structured value, printed as indent-4 JSON once its size is known to fit."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _forms(
    unit: PromptUnit, flavours: tuple[str, ...]
) -> list[tuple[Path, tuple[str | _Json, ...]]]:
    """Each field of the unit with the forms it is printed in, in order: texts, values,
    arguments."""
    fields: list[tuple[Path, tuple[str | _Json, ...]]] = [(p, (t,)) for p, t in unit.texts]
    if unit.values:
        fields += [(p, (_Json(v),)) for p, v in unit.values]
    if unit.arguments:
        raw, parsed = "llama_cpp" in flavours, "vllm" in flavours
        for arg in unit.arguments:
            forms: tuple[str | _Json, ...] = (arg.raw,) if raw else ()
            fields.append((arg.path, (*forms, _Json(arg.parsed)) if parsed else forms))
    return fields


def fields_tokens(
    unit: PromptUnit,
    how: PromptCounting,
    expansion: int,
    limit: int,
    over: Callable[[Path], LimitExceeded],
) -> int:
    """The fallback bound of one unit: each field counted exactly, plus the overheads and
    ``expansion``, its prompt template's tokens; ``over`` makes the refusal once past
    ``limit``."""
    counter = how.counter
    fields = _forms(unit, how.flavours)
    used = unit.fixed
    if used > limit:
        raise over(unit.path)
    if len(unit.texts) > 1:
        # Many short texts (400 messages, say) are refused from one bound over them all
        # before any is measured alone (a tokenizer call or several C passes each).
        texts = [text for _, text in unit.texts]
        if used + counter.lower_bound_of_sum(texts, enough=limit - used) > limit:
            raise over(unit.path)
    edge = _EDGE if unit.templated else 0
    # Tokens are at most max_token_bytes long (for other tokenizers, 64 bytes is assumed).
    token_bytes = max(counter.max_token_bytes, 64)
    for path, forms in fields:
        left = limit - used - edge
        weight = 0
        for form in forms:
            if left < 0:
                raise over(path)
            if isinstance(form, _Json):
                most = token_bytes * left
                if indent4_size(form.value, most) > most:
                    raise over(path)
                form = indent4_text(form.value)
            stats = counter.measure(form, left, exact=True)
            if not stats.within_limit:
                raise over(path)
            weight = max(weight, stats.tokens)
        used += weight + edge
    if used > limit:
        raise over(unit.path)
    if unit.template is not None:
        used += expansion
        if used > limit:
            raise over(("prompt_template",))
    return used
