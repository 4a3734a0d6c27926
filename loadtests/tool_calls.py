"""Whether an answer to a forced tool call carries the call: a look-alike whose ``tool_choice``
is ``"required"`` or names a function must come back with well-formed ``tool_calls`` (the
reference scheduler answers these with a call, as vLLM does), not with text.

Read on the whole (non-streamed) answer: each choice's message has a non-empty ``tool_calls``
of ``{"id", "type": "function", "function": {"name", "arguments"}}`` with string fields, the
named function's name when the request named one.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["forced_call_failure"]


def forced_call_failure(request_body: bytes, response_body: bytes) -> str | None:
    """Why a 2xx answer to ``request_body`` is not the tool call it forced; None when it is,
    or when the request forces no call."""
    try:
        request = json.loads(request_body)
    except ValueError:
        return None
    if not isinstance(request, dict):
        return None
    choice = request.get("tool_choice")
    if not request.get("tools") or not (choice == "required" or isinstance(choice, dict)):
        return None
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    try:
        answer = json.loads(response_body)
    except ValueError:
        return "forced tool call: the answer is not JSON"
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices:
        return "forced tool call: no choices"
    for c in choices:
        message = c.get("message") if isinstance(c, dict) else None
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if not isinstance(calls, list) or not calls:
            return "forced tool call: a choice has no tool_calls"
        for call in calls:
            if not _well_formed(call):
                return "forced tool call: a malformed tool call"
            if named is not None and call["function"]["name"] != named:
                return (
                    f"forced tool call: called {call['function']['name'][:64]!r}, not the named one"
                )
    return None


def _well_formed(call: Any) -> bool:
    if not isinstance(call, dict) or call.get("type") != "function":
        return False
    function = call.get("function")
    return (
        isinstance(call.get("id"), str)
        and isinstance(function, dict)
        and isinstance(function.get("name"), str)
        and isinstance(function.get("arguments"), str)
    )
