"""Forced tool calls: a chat request whose ``tool_choice`` is ``"required"`` or names a function
is answered with a call of that function (``"required"``: the first function tool), whose
``arguments`` are the smallest JSON instance of the function's ``parameters``
(:mod:`scheduler_ref.schema_instance`), as vLLM answers these requests with the output
constrained to the schema.

The arguments text is what the simulated model generates: its tokens (cl100k_base, the
reference's tokenizer) are emitted one per engine step, so the engine schedules, charges and
counts them as any output (``usage.completion_tokens`` is the number of argument tokens sent),
``max_tokens`` truncates them (finish reason ``length``, as vLLM), and a stream carries them as
argument deltas. A complete call finishes with ``tool_calls`` for ``"required"`` and ``stop``
for a named function: OpenAI's reasons, which vLLM follows (vllm-project/vllm#25054, #49496).

``tool_choice`` ``"auto"``, ``"none"`` or absent keeps plain text. Refused as vLLM's
``check_tool_usage`` refuses them (400): a named function no tool in ``tools`` has, a named
choice without a name, a forced choice without ``tools``; ``"required"`` with ``tools: []``
is ``"none"``, as in vLLM.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from guard.errors import GuardError
from scheduler_ref.schema_instance import InstanceTooLarge, minimal_instance

__all__ = ["ArgumentsStream", "ForcedCall", "forced_call"]

TOOL_ARGUMENTS_TOO_LARGE = "tool_arguments_too_large"


@dataclass(frozen=True, slots=True)
class ForcedCall:
    """The call every choice of a request answers with, and its arguments as tokens."""

    name: str
    arguments: str
    # The reason a choice finishes with once every argument token is out.
    finish_reason: Literal["tool_calls", "stop"]
    token_bytes: tuple[bytes, ...]

    @property
    def num_tokens(self) -> int:
        return len(self.token_bytes)

    def stream(self) -> ArgumentsStream:
        return ArgumentsStream(self)


@dataclass
class ArgumentsStream:
    """One choice's progress through the arguments: the text of the tokens emitted so far.

    Decoded incrementally: a character split over two tokens is released with the second.
    """

    call: ForcedCall
    sent_tokens: int = 0
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )

    @property
    def complete(self) -> bool:
        return self.sent_tokens >= self.call.num_tokens

    def advance(self, num_output_tokens: int) -> str:
        """The text of tokens ``sent_tokens .. num_output_tokens`` (past the end: nothing)."""
        upto = min(num_output_tokens, self.call.num_tokens)
        chunk = b"".join(self.call.token_bytes[self.sent_tokens : upto])
        self.sent_tokens = max(self.sent_tokens, upto)
        return self._decoder.decode(chunk, final=self.complete)


def forced_call(
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    encode: Callable[[str], Sequence[bytes]],
) -> ForcedCall | None:
    """The call ``tool_choice`` forces, or None (plain text).

    ``encode(text)`` gives the token bytes of the arguments text.
    """
    if isinstance(tool_choice, dict):
        name = _named(tool_choice)
        index = _find(tools, name)
        reason: Literal["tool_calls", "stop"] = "stop"
    elif tool_choice == "required":
        if tools is None:
            raise _no_tools()
        if not tools:
            return None  # vLLM: "required" with an empty list behaves as "none"
        index = _first_function(tools)
        reason = "tool_calls"
    else:
        return None
    assert tools is not None
    function = tools[index]["function"]
    arguments = _arguments(function.get("parameters"), f"tools[{index}].function.parameters")
    return ForcedCall(function["name"], arguments, reason, tuple(encode(arguments)))


def _named(choice: dict[str, Any]) -> str:
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise GuardError(
            "invalid_request",
            'a named tool_choice needs function.name: {"type": "function", '
            '"function": {"name": "my_function"}}',
            param="tool_choice.function.name",
        )
    return name


def _no_tools() -> GuardError:
    return GuardError(
        "invalid_request", "tool_choice forces a tool call, and tools is not set", param="tools"
    )


def _function_name(tool: Any) -> str | None:
    function = tool.get("function") if isinstance(tool, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


def _find(tools: list[dict[str, Any]] | None, name: str) -> int:
    if tools is None:
        raise _no_tools()
    for i, tool in enumerate(tools):
        if _function_name(tool) == name:
            return i
    raise GuardError(
        "invalid_request",
        f"tool_choice names {name[:64]!r}, which no tool in tools has",
        param="tool_choice.function.name",
    )


def _first_function(tools: list[dict[str, Any]]) -> int:
    for i, tool in enumerate(tools):
        if _function_name(tool) is not None:
            return i
    raise GuardError(
        "invalid_request",
        'tool_choice is "required" and no tool in tools is a function with a name',
        param="tools",
    )


def _arguments(parameters: Any, param: str) -> str:
    if parameters is None or isinstance(parameters, bool):
        parameters = {}  # vLLM: a function without parameters is called with {}
    if not isinstance(parameters, dict):
        raise GuardError("invalid_request", f"{param} must be a JSON Schema object", param=param)
    if "type" not in parameters:
        # Arguments are an object: a schema that does not say so still describes one.
        parameters = {**parameters, "type": "object"}
    try:
        # As vLLM serialises a forced call's arguments (json.dumps, ensure_ascii=False).
        return json.dumps(minimal_instance(parameters), ensure_ascii=False)
    except InstanceTooLarge as exc:
        reason = str(exc)
    except RecursionError:
        # A const nested about as deep as the body parser allows, serialised deeper in the stack.
        reason = "a const is nested too deeply"
    raise GuardError(
        TOOL_ARGUMENTS_TOO_LARGE,
        f"{param}: the smallest arguments it admits are too large ({reason})",
        param=param,
    )
