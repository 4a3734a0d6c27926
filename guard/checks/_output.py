"""The output cap of each sequence, as the tokens check settles it.

Every output-cap field a request sets (``max_tokens``, ``max_completion_tokens``, llama.cpp's
``n_predict``, TGI's ``max_new_tokens``, the Responses API's ``max_output_tokens``) must be within
``limits.tokens.max_output_tokens``, else what the context window allows (refused, or clamped as
the policy says); a generation request with none gets ``default_max_tokens`` injected, or, without
one, is left to generate to the end of the window (``implicit``). The fan-out check reads the
same cap (:func:`effective_output`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from guard.checks._result import Mutation
from guard.checks._tokens_limits import TokensLimits
from guard.errors import LimitExceeded
from guard.http import UpstreamKind
from guard.request import (
    INJECT_FIELD,
    Endpoint,
    lax_int,
    output_fields,
    requested_output,
    sequences_per_prompt,
)

__all__ = [
    "OutputCap",
    "clamped_to_window",
    "effective_output",
    "output_cap",
    "window_left",
    "window_remainder",
]


@dataclass(frozen=True, slots=True)
class OutputCap:
    """The output cap of each sequence: ``tokens`` set by the request (or injected), or, when
    ``implicit``, none: the upstream generates to the end of the window (``tokens`` is then
    the least it needs beside the prompt, 1). ``to_window``: fields over the window-derived
    cap, clamped once the prompt is counted to what the window leaves beside it.
    ``per_prompt``: the sequences generated per prompt (``max(n, best_of)``)."""

    tokens: int
    implicit: bool = False
    to_window: tuple[str, ...] = ()
    per_prompt: int = 1


def output_cap(
    body: dict[str, Any],
    endpoint: Endpoint,
    tokens: TokensLimits,
    kind: UpstreamKind,
    mutations: list[Mutation],
) -> OutputCap | None:
    """The output cap per sequence after clamping or injection, and the sequences per prompt;
    None when nothing is generated."""
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
    # llama-cpp-python drops n and best_of from the request (its server's model_dump excludes
    # them) and generates one sequence: the work it does, and the usage it reports.
    per_prompt = 1 if kind == "llama_cpp" else sequences_per_prompt(body)
    if to_window:
        return OutputCap(1, to_window=tuple(to_window), per_prompt=per_prompt)
    if requested is not None:
        value = requested[1]
        output = value if cap is None else (min(value, cap) if value > 0 else cap)
        if inject is not None and lax_int(body.get(inject)) is None and kind == "llama_cpp":
            # Only another field caps the output (max_completion_tokens, n_predict,
            # max_new_tokens): llama-cpp-python reads max_tokens alone, and without it
            # generates to the end of its context. vLLM reads max_completion_tokens itself.
            mutations.append(Mutation((inject,), output, "max_tokens_missing"))
        return OutputCap(output, per_prompt=per_prompt)
    if inject is None:
        return None
    if tokens.default_max_tokens is not None:
        mutations.append(Mutation((inject,), tokens.default_max_tokens, "default_max_tokens"))
        return OutputCap(tokens.default_max_tokens, per_prompt=per_prompt)
    return OutputCap(1, implicit=True, per_prompt=per_prompt)


def effective_output(
    body: Mapping[str, Any], endpoint: Endpoint, tokens: TokensLimits
) -> int | None:
    """The output cap after the tokens check (injected default, clamped): the largest output
    the upstream may generate per sequence; None for endpoints that generate nothing, or when
    nothing bounds it. Never raises: the tokens check reports a requested cap too large."""
    cap = tokens.output_limit
    requested = requested_output(body, endpoint)
    if requested is None:
        if endpoint not in INJECT_FIELD:
            return None
        return tokens.default_max_tokens if tokens.default_max_tokens is not None else cap
    value = requested[1]
    if cap is None:
        return value if value > 0 else None
    return value if 0 < value <= cap else cap


def clamped_to_window(
    output: OutputCap, per_unit: list[int], context_length: int, mutations: list[Mutation]
) -> OutputCap:
    """The fields over the window clamped to what it leaves beside the longest prompt."""
    left = max(1, context_length - max(per_unit, default=0))
    mutations.extend(Mutation((name,), left, "max_output_tokens") for name in output.to_window)
    return OutputCap(left, per_prompt=output.per_prompt)


def window_left(prompts: list[int], context_length: int | None) -> list[int]:
    """What the window leaves beside each prompt for an output without a cap (0 each when no
    window is known)."""
    if context_length is None:
        return [0] * len(prompts)
    return [max(0, context_length - used) for used in prompts]


def window_remainder(
    per_unit: list[int], prompts: int, per_prompt: int, context_length: int | None
) -> int:
    """The output a request without a cap may generate: what the window leaves after each
    prompt, per sequence (0 when no window is known: the limiter settles from ``usage``)."""
    # One conversation counted as a whole (chat) is one prompt.
    units = per_unit if len(per_unit) == prompts else [sum(per_unit)]
    return per_prompt * sum(window_left(units, context_length))
