"""A request's prompt as the upstream builds it, and its token count.

:func:`count_prompt` counts what the upstream will tokenize for a request (every string a chat
template can render, structured values as templates print them, the template's own text, media
estimates, special tokens; each query-document pair of vLLM's scoring routes), held to the
prompt cap and the context window, cheapest first: a byte bound, a lower bound, the upstream's
chat template rendered as vLLM 0.32 and llama-cpp-python 0.3.36 build the conversation
(:func:`load_chat_template` finds it), else a bound counted field by field. The token counts
themselves are :mod:`guard.tokens`'.

Also here, for the templates check: a prompt template's expansion bounded without expanding it
(:func:`bound_expansion`), and the size of a JSON value as templates print it
(:func:`indent4_size`).
"""

from guard.prompt._count import count_prompt
from guard.prompt._jsonsize import indent4_size
from guard.prompt._placeholders import Source, bound_expansion, parse_source
from guard.prompt._template_source import (
    ChatTemplateSource,
    check_chat_template_source,
    load_chat_template,
)
from guard.prompt._terms import Flavour, PromptCount, PromptCounting, PromptLimits
from guard.prompt._units import Counting

__all__ = [
    "ChatTemplateSource",
    "Counting",
    "Flavour",
    "PromptCount",
    "PromptCounting",
    "PromptLimits",
    "Source",
    "bound_expansion",
    "check_chat_template_source",
    "count_prompt",
    "indent4_size",
    "load_chat_template",
    "parse_source",
]
