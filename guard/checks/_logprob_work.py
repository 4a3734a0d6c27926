"""Log-probabilities in front of llama-cpp-python: work per position that grows with the
vocabulary and with the text before it.

llama-cpp-python 0.3.36 (``Llama._create_completion``) builds each position's log-probabilities
in Python: it sorts the whole vocabulary as ``(logprob, id)`` tuples and detokenises every token
before the position again (``detokenize(all_tokens[:idx])``). A request that asks for them
therefore costs its single worker ``P x (V + 3P)`` "sort entries" for ``P`` positions and a
``V``-token vocabulary, where the same request without them costs a few milliseconds per
token. Measured on the e2e model (V = 4,096; ``bench/llamacpp_logprobs.py``): ``echo`` of a
3,501-token prompt with ``logprobs: 1`` 21.7 s; 3,000 generated tokens with ``logprobs: 1``
29.7 s against 4.5 s without; one sort of a 128k vocabulary alone costs ~0.1-0.2 s.

Positions are the generated tokens of every sequence (the output cap, or what the window leaves
beside the prompt when the request sets none) and, for a completion with ``echo`` (not
streamed), the prompt's tokens. Asked for: a completion's ``logprobs`` set to anything but null
(0 included), a chat's truthy ``logprobs`` with ``top_logprobs`` set (it passes
``logprobs=top_logprobs if logprobs else None``). The vocabulary is the policy tokenizer's.

Refused over ``limits.tokens.max_logprob_work`` (``logprob_work_exceeded``), with the most
output tokens that would fit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import isqrt
from typing import Any

from guard.checks._output import window_left
from guard.errors import LimitExceeded
from guard.request import Endpoint, lax_bool

__all__ = [
    "PREFIX_WEIGHT",
    "check_llama_cpp_logprob_work",
    "echoes_prompt",
    "logprob_positions_asked",
    "logprob_work",
    "most_positions",
]

# Sort entries one detokenised prefix token weighs: fitted on the e2e model, a detokenised token
# (a ctypes call) costs ~2.6 us and a sort entry ~0.46 us at V = 4,096, over P^2 / 2 tokens.
PREFIX_WEIGHT = 3


def logprob_positions_asked(body: Mapping[str, Any], endpoint: Endpoint) -> bool:
    """Whether llama-cpp-python computes log-probabilities for this request."""
    if endpoint == "chat":
        return lax_bool(body.get("logprobs")) is True and body.get("top_logprobs") is not None
    if endpoint == "completions":
        return body.get("logprobs") is not None
    return False


def echoes_prompt(body: Mapping[str, Any], endpoint: Endpoint) -> bool:
    """Whether the prompt's own tokens are positions too: a completion's ``echo`` (not
    streamed) with log-probabilities asked for. A byte bound would refuse what fits: the prompt
    is then counted."""
    return (
        endpoint == "completions"
        and logprob_positions_asked(body, endpoint)
        and lax_bool(body.get("echo")) is True
        and lax_bool(body.get("stream")) is not True
    )


def logprob_work(positions: int, vocabulary: int) -> int:
    """Sort entries for ``positions`` positions of one sequence (module docstring)."""
    return positions * (vocabulary + PREFIX_WEIGHT * positions)


def most_positions(work: int, vocabulary: int) -> int:
    """The most positions whose :func:`logprob_work` is at most ``work``."""
    if work <= 0:
        return 0
    # P (V + wP) <= work: P = (-V + sqrt(V^2 + 4 w work)) / 2w, rounded down.
    p = (isqrt(vocabulary * vocabulary + 4 * PREFIX_WEIGHT * work) - vocabulary) // (
        2 * PREFIX_WEIGHT
    )
    while logprob_work(p + 1, vocabulary) <= work:
        p += 1
    while p > 0 and logprob_work(p, vocabulary) > work:
        p -= 1
    return p


def check_llama_cpp_logprob_work(
    body: Mapping[str, Any],
    endpoint: Endpoint,
    *,
    per_unit: Sequence[int],
    output: int | None,
    window: int | None,
    vocabulary: int,
    limit: int | None,
) -> int:
    """The request's log-probability work, raising ``logprob_work_exceeded`` over ``limit``.

    ``per_unit``: the prompt's tokens per sequence (counted when :func:`echoes_prompt`: they are
    echoed); ``output``: the output cap per sequence, None when the upstream generates to the
    end of the ``window``. A completion's prompts are positions each; a chat is one prompt
    (llama-cpp-python generates one sequence: it drops ``n`` and ``best_of``).
    """
    if not logprob_positions_asked(body, endpoint):
        return 0
    prompts = list(per_unit) if endpoint == "completions" else [sum(per_unit)]
    generated = window_left(prompts, window) if output is None else [output] * len(prompts)
    echoed = prompts if echoes_prompt(body, endpoint) else ()
    total = 0
    for i, made in enumerate(generated):
        prompt = echoed[i] if i < len(echoed) else 0
        positions = prompt + made
        total += logprob_work(positions, vocabulary)
        if limit is None or total <= limit:
            continue
        room = max(0, most_positions(limit, vocabulary) - prompt)
        what = (
            f"{prompt} echoed prompt tokens + {made} generated"
            if prompt
            else f"{made} generated tokens"
        )
        advice = (
            "drop echo or logprobs, or shorten the prompt"
            if room == 0
            else f"ask for at most {room} output tokens (max_tokens)"
        )
        raise LimitExceeded(
            "logprob_work_exceeded",
            f"logprobs make llama-cpp-python sort its {vocabulary}-token vocabulary in Python at "
            f"each of {positions} positions ({what}): {total} units of work, the limit "
            f"is {limit}; {advice}",
            param="echo" if room == 0 and prompt else _LOGPROBS_FIELD[endpoint],
        )
    return total


_LOGPROBS_FIELD: Mapping[str, str] = {"chat": "top_logprobs", "completions": "logprobs"}
