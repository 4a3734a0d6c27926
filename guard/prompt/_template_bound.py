"""The chat template's own text in the fallback bound: its literal program
(:func:`guard.jinja.literal_program`) sized by the request.

Used when no render of a conversation succeeds (or, weighed by bytes, in the byte bound): the
fields are counted by the caller; this adds what the template prints of its own, loops sized by
the request's messages, tools, documents, parts, calls and largest collection.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from guard.jinja import LoopSizes, literal_program
from guard.prompt._units import ChatInput
from guard.tokens import TokenCounter

__all__ = ["loop_sizes", "template_literal_bytes", "template_literal_tokens"]


def _length(value: Any) -> int:
    return len(value) if isinstance(value, list | dict) else 0


def _largest_collection(value: Any) -> int:
    """The longest list or mapping anywhere in ``value`` (a walk over the parsed body)."""
    largest = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            largest = max(largest, len(item))
            stack.extend(item.values())
        elif isinstance(item, list):
            largest = max(largest, len(item))
            stack.extend(item)
    return largest


def loop_sizes(chat: ChatInput) -> LoopSizes:
    messages = [m for m in chat.messages if isinstance(m, dict)]
    body = chat.body
    kwargs = body.get("chat_template_kwargs")
    tools = max(
        _length(body.get("tools")), _length(kwargs.get("tools")) if isinstance(kwargs, dict) else 0
    )
    documents = _length(body.get("documents"))
    if isinstance(kwargs, dict):
        documents = max(documents, _length(kwargs.get("documents")))
    return LoopSizes(
        messages=len(chat.messages),
        tools=max(tools, max((_length(m.get("tools")) for m in messages), default=0)),
        documents=documents,
        parts=max((_length(m.get("content")) for m in messages), default=0),
        calls=max((_length(m.get("tool_calls")) for m in messages), default=0),
        items=max(_largest_collection(body), len(chat.messages)),
    )


@functools.lru_cache(maxsize=64)
def _weighed(source: str, counter: TokenCounter) -> Callable[[LoopSizes], int]:
    return literal_program(source).weighed(lambda text: counter.count(text))


@functools.lru_cache(maxsize=64)
def _weighed_bytes(source: str) -> Callable[[LoopSizes], int]:
    return literal_program(source).weighed(lambda text: len(text.encode("utf-8", "surrogatepass")))


def template_literal_tokens(source: str, counter: TokenCounter, chat: ChatInput) -> int:
    """An upper bound on the tokens of the template's own text in this conversation."""
    return _weighed(source, counter)(loop_sizes(chat))


def template_literal_bytes(source: str, chat: ChatInput) -> int:
    """The same bound in UTF-8 bytes (an upper bound on tokens for byte-level BPE)."""
    return _weighed_bytes(source)(loop_sizes(chat))
