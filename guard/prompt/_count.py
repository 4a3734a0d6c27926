"""A request's prompt counted: what the upstream will tokenize, summed over its sequences, held
to the prompt cap and, sequence by sequence, to the context window beside the output.

:func:`count_prompt` is the one call, and the request goes one way through it:

1. the sequences are gathered (:mod:`._units`, and :mod:`._score` for vLLM's ``/score`` and
   ``/rerank``), and the chat template the upstream renders them with is found
   (:mod:`._template_source`);
2. the byte bound (:mod:`._byte_bound`): UTF-8 bytes bound the tokens of byte-level BPE, so a prompt
   whose bytes (indent-4 JSON for structured values, overheads added) fit is admitted
   untokenized (unless ``exact``, which defaults to true when the upstream's chat template is
   known);
3. otherwise each sequence is counted (:mod:`._sequences`): a lower bound of its strings over the
   limit refuses without rendering anything; a chat with the upstream's chat template known
   (configured, or the request's own when the policy accepts it) is rendered as the upstream
   renders it and counted (:mod:`._render`); otherwise each field is counted with an early stop
   at the tokens left (:mod:`._fields`), plus, when the template is known but no render
   succeeded, its literal text (:mod:`._template_bound`): the fallback bound.

The first limit crossed raises ``prompt_tokens_exceeded`` or ``context_length_exceeded``; a
render can raise the sandbox's ``chat_template_*`` limits and ``deadline_exceeded``, tool-call
arguments nested too deep ``json_depth_exceeded``. Asked for ``exact_per_unit``, a prompt the
bytes admit is counted as well (what the upstream's log-probabilities echo), once.
"""

from __future__ import annotations

from guard.prompt._byte_bound import byte_bound
from guard.prompt._score import score_units
from guard.prompt._sequences import count_sequences
from guard.prompt._template_source import chat_template_for
from guard.prompt._terms import PromptCount, PromptCounting, PromptLimits
from guard.prompt._units import prompt_units
from guard.request import RequestView

__all__ = ["count_prompt"]


def count_prompt(
    view: RequestView, how: PromptCounting, limits: PromptLimits, *, exact_per_unit: bool = False
) -> PromptCount:
    """The prompt of ``view`` counted (module docstring), or the first limit crossed as
    :class:`~guard.errors.LimitExceeded`; with ``exact_per_unit``, each sequence's exact count
    too."""
    body = view.obj or {}
    endpoint = view.endpoint
    if endpoint in ("score", "rerank"):
        units = score_units(body, endpoint, how.units)
    else:
        units = prompt_units(body, endpoint, how.units)
    media = sum(unit.media for unit in units)
    template = chat_template_for(body, how.chat_template, how.tokenizer, how.request_templates)
    exact = how.exact if how.exact is not None else template is not None
    bound = None
    if how.counter.byte_bounds and not exact:
        bound = byte_bound(units, how, limits, None if template is None else template[0])
        if bound is not None and not exact_per_unit:
            return PromptCount(bound[0], False, bound[1], media)
    per_unit = count_sequences(units, how, limits, template)
    if bound is not None:
        return PromptCount(bound[0], False, bound[1], media, per_unit)
    return PromptCount(sum(per_unit), True, per_unit, media, per_unit)
